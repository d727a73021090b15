//! `trainyard stacks NAME`: every rank's stacks of a run driven on this host, as SIGQUIT
//! (Ctrl-\) in its terminal gives them: the driver is sent SIGQUIT, captures them (the run
//! goes on) and writes the dump beside the rank logs, and this command prints that file.

use std::io::{self, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use trainyard::backend::{DriverLiveness, driver_liveness};
use trainyard::checkpoint::{RunFolder, RunRecord};

use crate::Failure;
use crate::args::{OutputFormat, StacksArgs};
use crate::runs::logs::stack_dumps;
use crate::runs::text::status_name;
use crate::runs::{catches, find, open_storage, proven_driver, runtime};

/// How long the driver gets to capture every rank's stacks and write them.
const LIMIT: Duration = Duration::from_secs(60);
/// How often the log folder is looked at meanwhile.
const POLL: Duration = Duration::from_millis(50);
/// How often the run's record is read meanwhile (whether the driver is still there).
const RECORD_EVERY: Duration = Duration::from_millis(500);

pub(crate) fn run(args: &StacksArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let (folder, record) = find(&storage, &runtime, &args.name)?;
    let (file, text) = runtime.block_on(capture(&folder, &record))?;
    let mut out = io::stdout().lock();
    if args.format == OutputFormat::Json {
        let value = serde_json::json!({ "file": file.display().to_string(), "text": text });
        return writeln!(out, "{value}").map_err(Failure::output);
    }
    match out
        .write_all(crate::inert_lines(&text).as_bytes())
        .and_then(|()| out.flush())
    {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
        Err(error) => return Err(Failure::output(error)),
    }
    say!("trainyard: the stacks are kept in {}", file.display());
    Ok(())
}

/// Asks the driver of `record`'s run for every rank's stacks and waits for the dump it
/// writes: its path and text.
pub(crate) async fn capture(
    folder: &RunFolder,
    record: &RunRecord,
) -> Result<(PathBuf, String), Failure> {
    let name = &record.name;
    let Some(driver) = record.driver.clone() else {
        return Err(Failure::other(format!(
            "run `{}` names no driver in its record: its stacks cannot be asked for from here",
            name
        )));
    };
    match driver_liveness(record) {
        DriverLiveness::Alive => {}
        DriverLiveness::Ended => {
            return Err(Failure::other(format!(
                "run `{}` is not running: it is {}",
                name,
                status_name(record.status)
            )));
        }
        DriverLiveness::Gone => {
            return Err(Failure::other(format!(
                "run `{}` is not running: its driver (pid {} on {}) is gone without a word",
                name, driver.pid, driver.host
            )));
        }
        DriverLiveness::Unknown => {
            return Err(Failure::other(format!(
                "run `{}` is driven on host {} (pid {}): run `trainyard stacks` there",
                name, driver.host, driver.pid
            )));
        }
    }
    let Some(dir) = record
        .attempts
        .last()
        .and_then(|attempt| attempt.log_dir.clone())
        .map(PathBuf::from)
    else {
        return Err(Failure::other(format!(
            "run `{}` has no log folder for its current attempt: its stacks have nowhere to go",
            name
        )));
    };
    // The dump is read from the folder the record names: only one of this user's.
    if let Err(error) = trainyard_sys::private::check_dir(&dir) {
        return Err(Failure::other(format!(
            "run `{name}`'s log folder cannot hold its stacks: {error}"
        )));
    }
    // Only `trainyard run` takes SIGQUIT for stacks: to another program it is a core dump.
    if catches(driver.pid, Signal::SIGQUIT) == Some(false) {
        return Err(Failure::other(format!(
            "the driver of run `{name}` (pid {}) does not take SIGQUIT for stacks: it is a program of its own, not `trainyard run`",
            driver.pid
        )));
    }
    let held = proven_driver(folder, record, &driver)?;
    let before = stack_dumps(&dir);
    if !held.signal(Signal::SIGQUIT) {
        return Err(Failure::other(format!(
            "cannot signal the driver of run `{}` (pid {}): it is gone",
            name, driver.pid
        )));
    }
    let started = Instant::now();
    let mut record_read = Instant::now();
    let file = loop {
        if let Some(file) = stack_dumps(&dir)
            .into_iter()
            .find(|(name, inode)| before.get(name) != Some(inode))
            .map(|(name, _)| dir.join(name))
        {
            break file;
        }
        if started.elapsed() > LIMIT {
            return Err(Failure::other(format!(
                "the driver of run `{}` (pid {}) wrote no stacks within {LIMIT:?}",
                name, driver.pid
            )));
        }
        if record_read.elapsed() > RECORD_EVERY {
            record_read = Instant::now();
            if let Ok(Some(now)) = folder.load().await {
                if driver_liveness(&now) != DriverLiveness::Alive {
                    return Err(Failure::other(format!(
                        "run `{}` ended before its stacks were written: it is {}",
                        name,
                        status_name(now.status)
                    )));
                }
            }
        }
        tokio::time::sleep(POLL).await;
    };
    let text = std::fs::read_to_string(&file).map_err(|error| {
        Failure::other(format!(
            "cannot read the stacks in {}: {error}",
            file.display()
        ))
    })?;
    Ok((file, text))
}
