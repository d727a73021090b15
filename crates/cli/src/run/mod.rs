//! `trainyard run`: start one worker per bundle on the local runtime, run a program on each
//! with its rank and its framework's environment, stream their output, and stop everything
//! on failure or interruption.
//!
//! Three steps, one module each: [`config`] turns the flags into the run's configuration,
//! [`drive`] runs it (the runtime, the trainer, the signals), and [`outcome`] says how it
//! ended and with which exit code.

mod config;
mod drive;
mod outcome;

use std::time::Duration;

use crate::Failure;
use crate::args::{RunArgs, RuntimeKind};
use crate::output::{Progress, init_logging};

/// How long the driver waits, as it exits, for the `--notify` webhook to take what is left.
const NOTIFY_LIMIT: Duration = Duration::from_secs(10);

/// How long the driver waits, as it exits, for work left on its blocking threads.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(10);

pub(crate) fn run(args: &RunArgs) -> Result<(), Failure> {
    let background = crate::background::is_background_driver();
    if background {
        crate::background::leave_the_terminal();
    }
    let progress = Progress::new(args.log_format);
    let timings = init_logging(args.log_format, &progress, args.timings);
    let launch = match config::request(args)? {
        config::Request::Drive(launch) => launch,
        config::Request::Detach(scaling) => {
            return crate::slurm::detach(
                &args.slurm,
                &scaling,
                args.name.as_deref(),
                args.output.as_deref(),
                args.program.len(),
            );
        }
    };
    // On Slurm a detached run is a batch job, which drives it here.
    if args.detach && !background && args.runtime != RuntimeKind::Slurm {
        let name = launch.run.name.clone().unwrap_or_default();
        return crate::background::detach(args, &name, launch.run.resume);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Failure::other)?;
    let worker = launch.worker.clone();
    let workers = launch.scaling.num_workers.max();
    let result = runtime.block_on(async {
        let mut ended = drive::drive(args, *launch, &progress).await?;
        let delivery = ended.delivery.take();
        let result = outcome::render(ended, args, timings.as_ref(), &worker, workers);
        if let Some(delivery) = delivery {
            delivery.finish(NOTIFY_LIMIT).await;
        }
        result
    });
    // What is left is clean-up on blocking threads (or a printer stuck on a stdout nobody
    // reads): bounded.
    runtime.shutdown_timeout(SHUTDOWN_LIMIT);
    result
}
