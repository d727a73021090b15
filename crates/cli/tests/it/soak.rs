//! The CI's short version of `cargo xtask soak`: the same driver, through the binary that
//! cargo built for these tests.

use std::path::Path;

use trainyard_test_support::soak as driver;

#[test]
fn twenty_one_back_to_back_runs_end_as_expected_and_leave_nothing_behind() {
    // Three times the mix of seven: every ending, interrupts included, three times over.
    match driver::soak(Path::new(env!("CARGO_BIN_EXE_trainyard")), 21) {
        Ok(report) => println!("{report}"),
        Err(problem) => panic!("{problem}"),
    }
}
