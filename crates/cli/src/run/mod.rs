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
    trainyard::backend::set_driver_command(recorded_command(std::env::args()));
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

/// The command line as the run's record keeps it: the values of `--env K=V` and the path of a
/// `--notify` URL (tokens of webhooks live there) left out. Words after `--` are the
/// program's and kept as they are; before it, a program's own `--env` is shortened too.
fn recorded_command(words: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut hide_next: Option<&str> = None;
    let mut done = false;
    for word in words {
        if done {
            out.push(word);
            continue;
        }
        if let Some(flag) = hide_next.take() {
            out.push(hidden(flag, &word));
            continue;
        }
        if word == "--" {
            done = true;
            out.push(word);
            continue;
        }
        match word.split_once('=') {
            Some((flag @ ("--env" | "--notify"), value)) => {
                out.push(format!("{flag}={}", hidden(flag, value)));
            }
            _ if word == "--env" || word == "--notify" => {
                hide_next = Some(if word == "--env" { "--env" } else { "--notify" });
                out.push(word);
            }
            _ => out.push(word),
        }
    }
    out
}

/// `value` of `flag` with what may be secret left out: `K=…` for `--env`, the scheme and host
/// of a `--notify` URL.
fn hidden(flag: &str, value: &str) -> String {
    match flag {
        "--env" => match value.split_once('=') {
            Some((key, _)) => format!("{key}=…"),
            None => "…".to_owned(),
        },
        _ => match reqwest::Url::parse(value) {
            Ok(url) => format!(
                "{}://{}/…",
                url.scheme(),
                url.host_str().unwrap_or_default()
            ),
            Err(_) => "…".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_command_leaves_out_env_values_and_webhook_paths_but_not_the_program() {
        let words = [
            "trainyard",
            "run",
            "--env",
            "TOKEN=s3cret",
            "--env=KEY=v",
            "--notify",
            "https://hooks.example.com/T000/B000/xyz?key=1",
            "--",
            "python",
            "--env",
            "A=b",
        ];
        assert_eq!(
            recorded_command(words.iter().map(|w| (*w).to_owned())),
            [
                "trainyard",
                "run",
                "--env",
                "TOKEN=…",
                "--env=KEY=…",
                "--notify",
                "https://hooks.example.com/…",
                "--",
                "python",
                "--env",
                "A=b",
            ]
        );
    }
}
