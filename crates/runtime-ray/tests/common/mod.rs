//! The test cluster lives in the crate ([`trainyard_runtime_ray::testing`]), where the command
//! line's tests use it too.

#![allow(unused_imports, unreachable_pub)] // each test binary uses part of it

pub use trainyard_runtime_ray::testing::*;
