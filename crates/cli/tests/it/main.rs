//! The command line's integration tests: each module runs the `trainyard` binary as a user would.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod bad_input;
mod checkpoints;
mod dashboard;
mod day_two;
mod elastic;
mod hangs;
mod interrupt;
mod ledger;
mod leftovers;
mod mlflow;
mod output;
mod plan;
mod ray;
mod run;
mod slurm;
mod soak;
mod storage;
mod surfaces;
mod torch;
mod torchrun;
mod users;
mod warm;
