//! Where the agent's own messages go: its original stderr, never a task's output.
//!
//! A function task runs inside the agent, so once the agent points its fds 1 and 2 at pipes
//! of its own (see [`crate::output`]), whatever is written there is the task's. The agent keeps
//! a duplicate of its original stderr first and says what it has to say there, through the
//! [`Diagnostics`] it was given at start-up.

use std::fmt;
use std::fs::File;
use std::io::Write as _;
use std::sync::Arc;

/// The agent's own messages' way out: its original stderr, kept apart from fd 2 once that is
/// a pipe of the agent's. Made once at start-up and handed to whoever has something to say.
/// Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Diagnostics {
    /// The duplicate of the original stderr; `None`: fd 2 still is the original.
    original: Option<Arc<File>>,
}

impl Diagnostics {
    /// Messages go to `original`, the agent's stderr as it started.
    pub(crate) fn to(original: File) -> Self {
        Self {
            original: Some(Arc::new(original)),
        }
    }

    /// Writes one line of the agent's own (`message`): never task output.
    pub(crate) fn diagnose(&self, message: impl fmt::Display) {
        let line = format!("{message}\n");
        // Nowhere else to say that saying failed.
        let _ = match &self.original {
            Some(stderr) => (&**stderr).write_all(line.as_bytes()),
            None => std::io::stderr().write_all(line.as_bytes()),
        };
    }
}
