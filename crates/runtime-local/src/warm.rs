//! The run's warm Python ([`WarmPythonSpec`]): one interpreter, started as the runtime starts,
//! that imports the modules it is given once and then starts each Python task of the run's
//! agents as a fork of itself (`python/trainyard/_warm.py`). It outlives attempts, so a
//! restart does not pay for starting Python and importing them again.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

use trainyard_wire::config::WarmPython;
use trainyard_wire::token::Token;

use crate::error::LocalError;

/// The warm Python's program: `python WARM_PY SOCKET MODULE...`, written beside its socket.
const SOURCE: &str = include_str!("../../../python/trainyard/_warm.py");

/// How long the warm Python gets to end its tasks and itself once told to.
const STOP_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// What the run's warm Python is: an interpreter, and what it imports before any task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPythonSpec {
    /// The interpreter, as the task's command names it once found on `PATH`. Tasks whose
    /// program is this path start from it; others start as always.
    pub python: PathBuf,
    /// The modules it imports first (`torch`, `numpy`, ...).
    pub modules: Vec<String>,
}

/// A started warm Python: killed, with the tasks it started, when dropped.
#[derive(Debug)]
pub(crate) struct WarmZygote {
    /// What agents are told.
    pub(crate) agent: WarmPython,
    /// The process and the pipe it reads its secret from; its end is its stop.
    process: Mutex<Option<(Child, ChildStdin)>>,
    /// The folder of its socket: this user's alone (mode 0700).
    _dir: trainyard_sys::private::TempDir,
}

impl WarmZygote {
    /// Starts the warm Python of `spec`; it imports in the background, then listens.
    pub(crate) fn start(spec: &WarmPythonSpec) -> Result<Self, LocalError> {
        let failed = |error: std::io::Error| LocalError::WarmPython {
            python: spec.python.clone(),
            error,
        };
        // Private (0700 whatever the umask): whoever could enter it could put a socket of
        // their own in the warm Python's place and be handed its secret.
        let dir = trainyard_sys::private::temp_dir("trainyard-warm-").map_err(failed)?;
        let socket = dir.path().join("warm.sock");
        let program = dir.path().join("warm.py");
        trainyard_sys::private::create_new(&program)
            .and_then(|mut file| file.write_all(SOURCE.as_bytes()))
            .map_err(failed)?;
        let token = Token::random()
            .map_err(|e| failed(std::io::Error::other(e)))?
            .to_hex();
        let mut child = Command::new(&spec.python)
            .arg(&program)
            .arg(&socket)
            .args(&spec.modules)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Away from the terminal's signals: the driver ends it.
            .process_group(0)
            .spawn()
            .map_err(failed)?;
        let mut stdin = child.stdin.take().expect("piped");
        if let Err(error) = stdin.write_all(format!("{token}\n").as_bytes()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed(error));
        }
        let pid = child.id();
        let start_time = trainyard_sys::procfs::read_stat(pid)
            .ok()
            .flatten()
            .and_then(|stat| stat.start_time);
        Ok(Self {
            agent: WarmPython {
                python: spec.python.clone(),
                socket,
                token,
                pid,
                start_time,
            },
            process: Mutex::new(Some((child, stdin))),
            _dir: dir,
        })
    }

    /// Ends the warm Python and whatever it still runs.
    pub(crate) fn stop(&self) {
        let Some((mut child, stdin)) = crate::lock(&self.process).take() else {
            return;
        };
        // Its stdin's end is its stop: it kills its tasks' groups and goes. Should it not
        // within a moment, SIGKILL (its tasks get SIGKILL as it dies: their parent-death
        // signal).
        drop(stdin);
        let deadline = std::time::Instant::now() + STOP_PATIENCE;
        while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for WarmZygote {
    fn drop(&mut self) {
        self.stop();
    }
}
