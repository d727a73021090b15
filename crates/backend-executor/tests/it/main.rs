//! The backend executor's integration tests, as one test binary: most of them run a whole
//! `fit` on the simulated cluster, through the set-up in [`common`].
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod backend;
mod checkpoints;
mod common;
mod crew;
mod elastic;
mod hangs;
mod interactions;
mod logs;
mod properties;
mod python_events;
