//! The reporters a run's config asks for, one line each: they take the run's events beside
//! those the program gives ([`BackendExecutor::reporters`](crate::BackendExecutor::reporters)).

mod mlflow;
mod tensorboard;

use trainyard_config::RunConfig;

use crate::Reporter;

/// The reporters `run` asks for.
pub(crate) fn configured(run: &RunConfig) -> Vec<Box<dyn Reporter>> {
    [
        boxed(
            run.tensorboard_dir
                .as_deref()
                .and_then(tensorboard::TensorBoard::new),
        ),
        boxed(run.mlflow.as_deref().and_then(mlflow::Mlflow::new)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `reporter`, boxed as the run keeps its reporters.
fn boxed<R: Reporter + 'static>(reporter: Option<R>) -> Option<Box<dyn Reporter>> {
    reporter.map(|reporter| Box::new(reporter) as _)
}
