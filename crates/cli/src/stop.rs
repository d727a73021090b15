//! `trainyard stop NAME`: stops a run driven on this host as Ctrl-C in its terminal does —
//! the driver stops the workers within their grace and exits, the run stays resumable — and
//! records it as `stopped`. A driver that is still there after [`PATIENCE`] is interrupted
//! again, which kills the workers; `--now` does that at once.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use trainyard::backend::{DriverLiveness, driver_liveness};
use trainyard::checkpoint::{RunFolder, RunRecord, RunStatus};

use crate::Failure;
use crate::args::{OutputFormat, StopArgs};
use crate::runs::text::status_name;
use crate::runs::{find, liveness_here, open_storage, proven_driver, runtime};

/// How long a driver gets to stop its workers after the first interrupt: a little over its
/// own limit for the stop.
const PATIENCE: Duration = Duration::from_secs(35);
/// How long a driver gets to exit after it was interrupted again.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How often the run's record is read while waiting.
const POLL: Duration = Duration::from_millis(50);
/// How often `--now` interrupts again while the driver is there (a second interrupt that
/// arrives with the first would be taken as one).
const AGAIN_EVERY: Duration = Duration::from_millis(300);

/// How a stop went.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Stopped {
    /// The run's status as the stop left it.
    pub(crate) status: &'static str,
    /// How long stopping it took, when it had to be stopped.
    pub(crate) seconds: Option<f64>,
    /// What is said of it, on one line.
    pub(crate) message: String,
}

pub(crate) fn run(args: &StopArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let (folder, record) = find(&storage, &runtime, &args.name)?;
    let stopped = runtime.block_on(stop(&folder, record, args.now))?;
    match args.format {
        OutputFormat::Text => say!("{}", crate::inert(&stopped.message)),
        OutputFormat::Json => {
            let mut out = std::io::stdout().lock();
            let written = serde_json::to_writer(
                &mut out,
                &serde_json::json!({
                    "name": args.name,
                    "status": stopped.status,
                    "seconds": stopped.seconds,
                    "message": stopped.message,
                }),
            )
            .map_err(std::io::Error::other)
            .and_then(|()| std::io::Write::write_all(&mut out, b"\n"));
            written.map_err(Failure::output)?;
        }
    }
    Ok(())
}

/// Stops the run of `record` as Ctrl-C in its driver's terminal does (`now`: as a second
/// Ctrl-C does), waiting until the driver has ended, and records it as `stopped`.
pub(crate) async fn stop(
    folder: &RunFolder,
    record: RunRecord,
    now: bool,
) -> Result<Stopped, Failure> {
    let name = record.name.clone();
    let Some(driver) = record.driver.clone() else {
        return Err(Failure::other(format!(
            "run `{}` names no driver in its record: it cannot be stopped from here",
            name
        )));
    };
    match liveness_here(folder, &record).await {
        DriverLiveness::Alive => {}
        DriverLiveness::Ended => {
            return Ok(Stopped {
                status: status_name(record.status),
                seconds: None,
                message: format!(
                    "trainyard: run `{name}` is not running: it is {}",
                    status_name(record.status)
                ),
            });
        }
        DriverLiveness::Gone => {
            return Ok(Stopped {
                status: "lost",
                seconds: None,
                message: format!(
                    "trainyard: run `{name}` is not running: its driver (pid {} on {}) is gone without a word; the same command resumes it",
                    driver.pid, driver.host
                ),
            });
        }
        DriverLiveness::Unknown if driver.slurm_job.is_some() => {
            return stop_through_slurm(folder, &name, &driver, now).await;
        }
        DriverLiveness::Unknown => {
            return Err(Failure::other(format!(
                "run `{}` is driven on host {} (pid {}): stop it there",
                name, driver.host, driver.pid
            )));
        }
    }
    let held = proven_driver(folder, &record, &driver)?;
    let started = Instant::now();
    if !held.signal(Signal::SIGINT) {
        return Err(Failure::other(format!(
            "cannot interrupt the driver of run `{}` (pid {}): it is gone",
            name, driver.pid
        )));
    }
    let again_every = now.then_some(AGAIN_EVERY);
    let ended = wait_for_end(folder, &held, PATIENCE, again_every).await;
    let ended = match ended {
        Some(record) => Some(record),
        None => {
            say!(
                "trainyard: the driver of run `{}` did not stop its workers within {PATIENCE:?}: killing them",
                name
            );
            wait_for_end(folder, &held, KILL_WAIT, Some(AGAIN_EVERY)).await
        }
    };
    let Some(record) = ended else {
        return Err(Failure::other(format!(
            "the driver of run `{}` (pid {}) is still there after it was interrupted twice",
            name, driver.pid
        )));
    };
    stopped(folder, Some(record), &driver, started, "").await
}

/// Records the run of `record` (its record once its driver ended, when it could be read) as
/// stopped, and says so; `via` tells how its driver was reached.
async fn stopped(
    folder: &RunFolder,
    record: Option<RunRecord>,
    driver: &trainyard::checkpoint::DriverRecord,
    started: Instant,
    via: &str,
) -> Result<Stopped, Failure> {
    let name = folder.name();
    // A driver interrupted twice exits without writing its record: it was this command's
    // interrupts that ended it all the same.
    if let Some(mut record) = record {
        if matches!(record.status, RunStatus::Interrupted | RunStatus::Running) {
            record.status = RunStatus::Stopped;
            folder.save(&record).await.map_err(Failure::other)?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Stopped {
        status: "stopped",
        seconds: Some(seconds),
        message: format!(
            "trainyard: run `{name}` stopped in {seconds:.1}s (its driver was pid {} on {}{via}); the same command resumes it",
            driver.pid, driver.host
        ),
    })
}

/// Stops a run whose driver runs in Slurm job `driver.slurm_job` on another host: SIGINT to
/// the job's batch step (the driver: Ctrl-C), then, if the run is still running after
/// [`PATIENCE`] (at once with `now`), the whole job is cancelled.
async fn stop_through_slurm(
    folder: &RunFolder,
    name: &str,
    driver: &trainyard::checkpoint::DriverRecord,
    now: bool,
) -> Result<Stopped, Failure> {
    let job = driver.slurm_job.clone().unwrap_or_default();
    let started = Instant::now();
    // A record names any job (on S3 anyone with the bucket writes one): only a job id, of a
    // job of this user's named after the run (as `--detach` submits it), is signalled.
    if !is_job_id(&job) || driver.uid != nix::unistd::getuid().as_raw() {
        return Err(Failure::other(format!(
            "run `{name}` names `{}` (uid {}) as its driver's Slurm job: not a job of this user's, nothing is cancelled",
            job, driver.uid
        )));
    }
    if let Some(owner) = job_of_another_run(name, &job).await {
        return Err(Failure::other(format!(
            "run `{name}` names Slurm job {job} as its driver's, but that job is {}: nothing is cancelled",
            owner
        )));
    }
    let asked = if now {
        scancel(name, &[&job]).await
    } else {
        scancel(name, &["--batch", "--signal=INT", &job]).await
    };
    if let Err(failure) = asked {
        // A job that has left the queue took its driver with it.
        let queued = trainyard::slurm::slurm::output("squeue", &["-h", "-o", "%i"]).await;
        if queued.is_ok_and(|queued| !queued.lines().any(|line| line.trim() == job)) {
            return Ok(Stopped {
                status: "lost",
                seconds: None,
                message: format!(
                    "trainyard: run `{name}` is not running: its Slurm job {job} is gone; the same command resumes it"
                ),
            });
        }
        return Err(failure);
    }
    let deadline = Instant::now() + PATIENCE;
    let mut record = loop {
        if let Ok(Some(record)) = folder.load().await {
            if record.status != RunStatus::Running {
                break Some(record);
            }
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(POLL).await;
    };
    if record.is_none() {
        say!(
            "trainyard: the driver of run `{name}` did not stop its workers within {PATIENCE:?}: cancelling Slurm job {job}"
        );
        scancel(name, &[&job]).await?;
        record = folder.load().await.ok().flatten();
    }
    stopped(
        folder,
        record,
        driver,
        started,
        &format!(", in Slurm job {job}"),
    )
    .await
}

/// Whether `job` is a Slurm job id (`123`, or an array task's `123_4`), nothing else.
fn is_job_id(job: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    match job.split_once('_') {
        Some((job, task)) => digits(job) && digits(task),
        None => digits(job),
    }
}

/// What Slurm job `job` is when it is not run `name`'s (`--detach` names its job after the run,
/// and the run may have taken `NAME-2`... under `--resume never`): `None` when it is a job of
/// this user's with that name, or when Slurm no longer knows it.
async fn job_of_another_run(name: &str, job: &str) -> Option<String> {
    let said = trainyard::slurm::slurm::output("squeue", &["-h", "-j", job, "-o", "%u|%j"])
        .await
        .ok()?;
    let (user, job_name) = said.lines().next()?.trim().split_once('|')?;
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|user| user.name);
    let named = name == job_name
        || name
            .strip_prefix(job_name)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if me.as_deref() != Some(user) {
        Some(format!("user {user}'s"))
    } else if !named {
        Some(format!("named `{job_name}`"))
    } else {
        None
    }
}

/// `scancel ARGS` for run `name` (the job id last).
async fn scancel(name: &str, args: &[&str]) -> Result<(), Failure> {
    trainyard::slurm::slurm::output("scancel", args)
        .await
        .map(drop)
        .map_err(|error| {
            Failure::other(format!(
                "cannot stop run `{name}` through its Slurm job {}: {error}",
                args.last().copied().unwrap_or_default()
            ))
        })
}

/// Waits up to `limit` for the run's driver to end; its last record once it has. With
/// `again_every`, interrupts the driver again at that pace meanwhile.
async fn wait_for_end(
    folder: &RunFolder,
    driver: &trainyard_sys::procfs::ProcessHandle,
    limit: Duration,
    again_every: Option<Duration>,
) -> Option<RunRecord> {
    let deadline = Instant::now() + limit;
    let mut next_again = again_every.map(|every| Instant::now() + every);
    loop {
        if let Ok(Some(record)) = folder.load().await {
            if driver_liveness(&record) != DriverLiveness::Alive {
                return Some(record);
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        if let (Some(at), Some(every)) = (next_again, again_every) {
            if Instant::now() >= at {
                let _ = driver.signal(Signal::SIGINT);
                next_again = Some(at + every);
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
