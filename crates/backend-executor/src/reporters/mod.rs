//! The reporters a run's config asks for, one line each: they take the run's events beside
//! those the program gives ([`BackendExecutor::reporters`](crate::BackendExecutor::reporters)).

mod tensorboard;

use trainyard_config::RunConfig;

use crate::Reporter;

/// The reporters `run` asks for.
pub(crate) fn configured(run: &RunConfig) -> Vec<Box<dyn Reporter>> {
    let mut reporters: Vec<Box<dyn Reporter>> = Vec::new();
    let mut add = |reporter: Option<Box<dyn Reporter>>| reporters.extend(reporter);
    add(run
        .tensorboard_dir
        .as_deref()
        .and_then(tensorboard::TensorBoard::new)
        .map(|r| Box::new(r) as _));
    reporters
}
