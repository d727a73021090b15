//! `cargo xtask soak [--runs N]`: N (300 by default) back-to-back `trainyard run`s of the
//! local runtime, a mix of successes, failures, bad input, infeasible requests and
//! interrupts; afterwards no process of the runs, no extra descriptor or listening socket of
//! the soak, and no ledger entry may remain. The CI runs a short version,
//! `crates/cli/tests/soak.rs`, through the same driver.

use trainyard_test_support::soak as driver;

const RUNS: usize = 300;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let runs = runs(args)?;
    crate::cargo(&["build", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("debug/trainyard");
    let report = driver::soak(&trainyard, runs)?;
    println!("{report}");
    Ok(())
}

/// `--runs N` (or `--runs=N`), else [`RUNS`].
fn runs(args: &[String]) -> Result<usize, String> {
    let usage = || format!("usage: cargo xtask soak [--runs N] (got {args:?})");
    match args {
        [] => Ok(RUNS),
        [flag, n] if flag == "--runs" => n.parse().map_err(|_| usage()),
        [flag] => flag
            .strip_prefix("--runs=")
            .and_then(|n| n.parse().ok())
            .ok_or_else(usage),
        _ => Err(usage()),
    }
}
