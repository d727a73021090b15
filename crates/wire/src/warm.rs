//! A started warm Python ([`WarmZygote`]): one interpreter that imports the modules of a
//! [`WarmPythonSpec`] once and then starts Python tasks as forks of itself
//! (`python/trainyard/_warm.py`), so that a restarted rank does not pay for starting Python
//! and importing them again. The local runtime starts one for the run, next to its driver;
//! an agent on another host starts its own ([`AgentConfig::start_warm_python`]).
//!
//! [`AgentConfig::start_warm_python`]: crate::config::AgentConfig::start_warm_python

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};

use crate::config::{WarmPython, WarmPythonSpec};
use crate::token::Token;

/// The warm Python's program: `python WARM_PY SOCKET MODULE...`, written beside its socket.
const SOURCE: &str = include_str!("../../../python/trainyard/_warm.py");

/// How long the warm Python gets to end its tasks and itself once told to.
const STOP_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// A started warm Python: ended, with the tasks it started, when stopped or dropped.
#[derive(Debug)]
pub struct WarmZygote {
    /// What agents are told.
    endpoint: WarmPython,
    /// The process and the pipe it reads its secret from; its end is its stop.
    process: Mutex<Option<(Child, ChildStdin)>>,
    /// The folder of its socket: this user's alone (mode 0700).
    _dir: trainyard_sys::private::TempDir,
}

impl WarmZygote {
    /// Starts the warm Python of `spec` as a child of this process, in a process group of
    /// its own (away from the terminal's signals), with its stderr this process's; it
    /// imports in the background, then listens.
    ///
    /// # Errors
    /// When its folder, program or process cannot be made.
    pub fn start(spec: &WarmPythonSpec) -> std::io::Result<Self> {
        // Private (0700 whatever the umask): whoever could enter it could put a socket of
        // their own in the warm Python's place and be handed its secret.
        let dir = trainyard_sys::private::temp_dir("trainyard-warm-")?;
        let socket = dir.path().join("warm.sock");
        let program = dir.path().join("warm.py");
        trainyard_sys::private::create_new(&program)?.write_all(SOURCE.as_bytes())?;
        let token = Token::random().map_err(std::io::Error::other)?.to_hex();
        let mut child = Command::new(&spec.python)
            .arg(&program)
            .arg(&socket)
            .args(&spec.modules)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let mut stdin = child.stdin.take().expect("piped");
        if let Err(error) = stdin.write_all(format!("{token}\n").as_bytes()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
        let pid = child.id();
        let start_time = trainyard_sys::procfs::read_stat(pid)
            .ok()
            .flatten()
            .and_then(|stat| stat.start_time);
        Ok(Self {
            endpoint: WarmPython {
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

    /// What an agent is told of it.
    #[must_use]
    pub const fn endpoint(&self) -> &WarmPython {
        &self.endpoint
    }

    /// Ends the warm Python and whatever it still runs. Blocks for a moment at most.
    pub fn stop(&self) {
        let Some((mut child, stdin)) = self
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
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
