//! `trainyard run --detach` on the local and Ray runtimes: the same command is started again
//! as the run's driver in a session of its own (no terminal: closing this one does not stop
//! it), its output going to a file; this process returns once the run's workers have started
//! (the driver says so by making a file this process names) and its record names the new
//! driver, printing the run's name and how to follow it.
//! A driver that ends before that (bad input, nothing to schedule, a run that was quick) has
//! its output shown here and its exit code returned, and leaves no file behind.
//!
//! The output file is made beside the run folders of a local storage and renamed into the run
//! folder (`driver-TIME.log`) once the run is found; with remote storage it is
//! `trainyard-NAME.out` in this directory; `--output FILE` puts it anywhere. Every file is
//! made or opened through `trainyard_sys::private`: beside the run folders under a name no one
//! can guess; elsewhere a file of this user's is appended to, another user's or a link refused.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use trainyard::checkpoint::Storage;
use trainyard_config::ResumePolicy;

use crate::Failure;
use crate::args::RunArgs;
use crate::runs::{driven_by, open_storage_at, runtime};

/// Set in the environment of a driver started in the background: the file it makes once its
/// workers have started.
pub(crate) const BACKGROUND_VAR: &str = "TRAINYARD_BACKGROUND_DRIVER";

/// How long the run may take to begin its first attempt (a Ray head coming up included)
/// before this process returns all the same.
const START_LIMIT: Duration = Duration::from_secs(120);
/// How often the run's record is looked at meanwhile.
const POLL: Duration = Duration::from_millis(50);

/// Whether this process is a driver started in the background by `--detach`.
pub(crate) fn is_background_driver() -> bool {
    std::env::var_os(BACKGROUND_VAR).is_some()
}

/// Tells the process that started this driver in the background that the run's workers have
/// started (the file it waits for); nothing for a driver in the foreground.
pub(crate) fn say_started() {
    if let Some(ready) = std::env::var_os(BACKGROUND_VAR).filter(|path| !path.is_empty()) {
        let _ = trainyard_sys::private::create_new(Path::new(&ready));
    }
}

/// Leaves the terminal's session, so that its hang-up and its Ctrl-C never reach this driver.
pub(crate) fn leave_the_terminal() {
    let _ = nix::unistd::setsid();
}

/// Starts this same command again as run `name`'s driver in the background, and waits until
/// its first attempt has begun.
pub(crate) fn detach(args: &RunArgs, name: &str, resume: ResumePolicy) -> Result<(), Failure> {
    let storage = open_storage_at(crate::args::storage_given(args.storage.as_deref()))?;
    let mut output = Output::open(args.output.as_deref(), &storage, name)?;
    // The driver says its workers have started by making this file.
    let signal = trainyard_sys::private::temp_dir("trainyard-detach-").map_err(Failure::other)?;
    let ready = signal.path().join("started");
    let mut child = spawn(args, args.name.is_none().then_some(name), &output, &ready)?;
    let pid = child.id();
    let runtime = runtime()?;
    let started = Instant::now();
    let found = loop {
        if let Some(status) = child.try_wait().map_err(Failure::other)? {
            let said = output.take();
            let said = said.trim_end();
            if !said.is_empty() {
                say!("{said}");
            }
            let code = status.code().unwrap_or(1);
            // It said why; its code is this command's.
            return match u8::try_from(code) {
                Ok(0) => Ok(()),
                Ok(code) => Err(Failure::said(code)),
                Err(_) => Err(Failure::other(format!(
                    "the run's driver (pid {pid}) ended before the run started: {status}"
                ))),
            };
        }
        // Placed and started: a run refused (nothing to schedule it on) never gets here.
        if ready.exists() {
            if let Some(found) = runtime.block_on(driven_by(&storage, name, resume, pid)) {
                break Some(found);
            }
        }
        if started.elapsed() > START_LIMIT {
            break None;
        }
        std::thread::sleep(POLL);
    };
    let name = found.as_ref().map_or(name, |record| record.name.as_str());
    let file = output.settle(&storage, name);
    println!("{name}");
    if found.is_none() {
        say!("trainyard: run `{name}` is still starting after {START_LIMIT:?} (driver pid {pid})");
    } else {
        say!("trainyard: run `{name}` goes on in the background (driver pid {pid})");
    }
    say!("  follow it:  trainyard logs {name} -f");
    say!("  stop it:    trainyard stop {name}");
    say!("  its driver's output: {}", file.display());
    // Not waited for: it goes on when this process exits.
    drop(child);
    Ok(())
}

/// The same command line, as the driver of the run in the background; `generated` is the
/// name it is given when the command gave none. What may be secret on it goes in the
/// driver's environment instead (`crate::secrets::passed_on`).
fn spawn(
    args: &RunArgs,
    generated: Option<&str>,
    output: &Output,
    ready: &Path,
) -> Result<Child, Failure> {
    let exe = std::env::current_exe().map_err(Failure::other)?;
    let all: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (all, secrets) = crate::secrets::passed_on(&all, args.program.len());
    let mut words: Vec<std::ffi::OsString> = all.into_iter().skip(1).collect();
    // `run` is the first word (no flag comes before the subcommand): the name goes after it,
    // before the program's own words.
    if let Some(name) = generated {
        words.insert(1, "--name".into());
        words.insert(2, name.into());
    }
    let file = output.file.try_clone().map_err(Failure::other)?;
    let err = output.file.try_clone().map_err(Failure::other)?;
    Command::new(exe)
        .args(words)
        .envs(secrets)
        .env(BACKGROUND_VAR, ready)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|error| Failure::other(format!("cannot start the run's driver: {error}")))
}

/// Where the driver's output goes. A file this process made is removed again unless the run
/// started (whatever way this process ends up failing before that).
struct Output {
    file: File,
    path: PathBuf,
    /// Whether it moves into the run folder once the run is found (local storage, no
    /// `--output`).
    moves: bool,
    /// Whether this process made the file (it was not there).
    created: bool,
    /// Its length before the driver wrote to it (a `--output` file may hold earlier output).
    start: u64,
    /// Whether it is kept: the run started.
    kept: bool,
}

impl Output {
    fn open(given: Option<&Path>, storage: &Storage, name: &str) -> Result<Self, Failure> {
        let (path, moves) = match (given, storage.run(name).local_path()) {
            (Some(path), _) => (
                std::path::absolute(path).unwrap_or(path.to_path_buf()),
                false,
            ),
            (None, Some(run_dir)) => {
                let root = run_dir.parent().map(Path::to_path_buf).unwrap_or_default();
                trainyard_sys::private::missing_dirs(&root).map_err(|error| {
                    Failure::other(format!("cannot make {}: {error}", root.display()))
                })?;
                return Self::beside_runs(&root, name);
            }
            (None, None) => (
                std::path::absolute(format!("trainyard-{name}.out"))
                    .unwrap_or_else(|_| PathBuf::from(format!("trainyard-{name}.out"))),
                false,
            ),
        };
        // A file of this user's is appended to; another user's, or a link, is refused.
        let (file, created) = trainyard_sys::private::append(&path).map_err(|error| {
            Failure::other(format!(
                "cannot open {} for the driver's output: {error}",
                path.display()
            ))
        })?;
        let start = file.metadata().map_or(0, |meta| meta.len());
        Ok(Self {
            file,
            path,
            moves,
            created,
            start,
            kept: false,
        })
    }

    /// A new file beside the run folders in `root`, under a name no one could have guessed
    /// and made first (the storage root may be shared): moved into the run folder once the
    /// run is found.
    fn beside_runs(root: &Path, name: &str) -> Result<Self, Failure> {
        let prefix = format!(".driver-{name}-{}-", std::process::id());
        let (file, path) =
            trainyard_sys::private::create_unique(root, &prefix, ".log").map_err(|error| {
                Failure::other(format!(
                    "cannot make a file in {} for the driver's output: {error}",
                    root.display()
                ))
            })?;
        Ok(Self {
            file,
            path,
            moves: true,
            created: true,
            start: 0,
            kept: false,
        })
    }

    /// What the driver wrote, for a driver that ended before its run started (the file goes
    /// when this process made it).
    fn take(mut self) -> String {
        let mut text = String::new();
        if std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(self.start)).is_ok() {
            let _ = self.file.read_to_string(&mut text);
        }
        text
    }

    /// Where the output is kept from now on: moved into run `name`'s folder when it is made
    /// beside it.
    fn settle(&mut self, storage: &Storage, name: &str) -> PathBuf {
        self.kept = true;
        let Some(run_dir) = storage.run(name).local_path().filter(|_| self.moves) else {
            return self.path.clone();
        };
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', "");
        let kept = run_dir.join(format!("driver-{stamp}.log"));
        match std::fs::rename(&self.path, &kept) {
            Ok(()) => kept,
            Err(_) => self.path.clone(),
        }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.created && !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
