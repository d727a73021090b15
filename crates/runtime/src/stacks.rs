//! What a worker answers to [`crate::Request::Stacks`]: the stacks of its task's processes at
//! one moment — Python frames where they could be read, and for every thread its scheduler
//! state and kernel wait channel — and how to show them in one line or in full.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

/// The stacks of a task's processes at one moment, as its worker captured them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStacks {
    /// The task's process tree, the task's own process first (for a task that runs inside
    /// the worker, the worker's own process, its task's thread first). Empty when no task
    /// runs.
    pub processes: Vec<ProcessStacks>,
    /// What could not be captured, and why (no py-spy, a dump that timed out), for readers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One process of a task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStacks {
    /// Its process id.
    pub pid: u32,
    /// Its command line.
    pub command: String,
    /// Its threads, the main one (or the task's) first.
    pub threads: Vec<ThreadStack>,
}

/// One thread: where the scheduler and the kernel see it, and its frames when they could be
/// read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStack {
    /// Its thread id.
    pub tid: u32,
    /// Its name (`comm`, or Python's thread name).
    pub name: String,
    /// Its state, as `/proc/<pid>/task/<tid>/stat` tells it: `R`, `S`, `D`, `Z`, `T`, ...
    pub state: String,
    /// The kernel function it waits in (`/proc/.../wchan`), when it waits in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Its frames, innermost first; empty when none could be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<Frame>,
}

/// One frame of a stack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// The function.
    pub function: String,
    /// Its file (a source file, or the library of a native frame).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Its line in that file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

impl Frame {
    /// Whether it is a native frame (a C function in a library): it has no line.
    #[must_use]
    pub const fn is_native(&self) -> bool {
        self.line.is_none()
    }

    /// Whether it is the interpreter's own C code (`time_sleep` in `libpython3.11.so`): the
    /// builtin a Python frame called.
    fn is_interpreter(&self) -> bool {
        self.is_native()
            && self
                .file
                .as_deref()
                .is_some_and(|f| f.starts_with("libpython") || f.starts_with("python"))
    }
}

/// The frames a one-line summary shows, innermost first: with Python frames, those, after
/// the interpreter builtin the innermost one called (`time_sleep`), if any; else all of
/// them.
fn shown_frames(frames: &[Frame]) -> Vec<&Frame> {
    let Some(first_python) = frames.iter().position(|f| !f.is_native()) else {
        return frames.iter().collect();
    };
    let builtin = first_python
        .checked_sub(1)
        .map(|i| &frames[i])
        .filter(|f| f.is_interpreter());
    builtin
        .into_iter()
        .chain(frames[first_python..].iter().filter(|f| !f.is_native()))
        .collect()
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.function)?;
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, " ({file}:{line})"),
            (Some(file), None) => write!(f, " ({file})"),
            (None, _) => Ok(()),
        }
    }
}

/// How a state letter reads.
fn state_name(state: &str) -> &'static str {
    match state {
        "R" => "running",
        "S" => "sleeping",
        "D" => "disk sleep",
        "Z" => "zombie",
        "T" => "stopped",
        "t" => "tracing stop",
        "X" => "dead",
        "I" => "idle",
        _ => "unknown",
    }
}

impl ThreadStack {
    /// `S hrtimer_nanosleep`: the state and what it waits in.
    fn wait(&self) -> String {
        match &self.wchan {
            Some(wchan) => format!("{} {wchan}", self.state),
            None => self.state.clone(),
        }
    }
}

impl TaskStacks {
    /// The process and thread that tell the most: the first process with frames (the Python
    /// program under a shell, say), else the last of the tree (a leaf: where the work is, as
    /// `sleep` under `sh`); in it, the first thread with frames, else its first.
    #[must_use]
    pub fn focus(&self) -> Option<(&ProcessStacks, &ThreadStack)> {
        let with_frames = self.processes.iter().find_map(|p| {
            p.threads
                .iter()
                .find(|t| !t.frames.is_empty())
                .map(|t| (p, t))
        });
        with_frames.or_else(|| {
            self.processes
                .last()
                .and_then(|p| p.threads.first().map(|t| (p, t)))
        })
    }

    /// One line: the focus's process id, its state and wait channel, and its `max_frames`
    /// innermost frames, `←` pointing outwards (Python frames only when it has any, after
    /// the interpreter builtin the innermost one called: `time_sleep ← <module> (x.py:9)`).
    ///
    /// ```
    /// use trainyard_runtime::stacks::{Frame, ProcessStacks, TaskStacks, ThreadStack};
    ///
    /// let frame = |function: &str, file: &str, line| Frame {
    ///     function: function.into(), file: Some(file.into()), line: Some(line),
    /// };
    /// let stacks = TaskStacks {
    ///     processes: vec![ProcessStacks {
    ///         pid: 4241,
    ///         command: "python train.py".into(),
    ///         threads: vec![ThreadStack {
    ///             tid: 4241,
    ///             name: "MainThread".into(),
    ///             state: "S".into(),
    ///             wchan: Some("do_epoll_wait".into()),
    ///             frames: vec![
    ///                 Frame { function: "pthread_cond_wait".into(), file: Some("libc.so.6".into()), line: None },
    ///                 frame("all_reduce", "torch/distributed/distributed_c10d.py", 4181),
    ///                 frame("<module>", "train.py", 57),
    ///             ],
    ///         }],
    ///     }],
    ///     notes: vec![],
    /// };
    /// assert_eq!(
    ///     stacks.summary(3),
    ///     "pid 4241, S do_epoll_wait: all_reduce (torch/distributed/distributed_c10d.py:4181) \
    ///      ← <module> (train.py:57)"
    /// );
    /// ```
    #[must_use]
    pub fn summary(&self, max_frames: usize) -> String {
        let Some((process, thread)) = self.focus() else {
            return match self.notes.first() {
                Some(note) => format!("no stacks: {note}"),
                None => "no task process".to_owned(),
            };
        };
        let mut line = format!("pid {}, {}", process.pid, thread.wait());
        let frames = shown_frames(&thread.frames);
        if !frames.is_empty() {
            line.push_str(": ");
            let shown: Vec<String> = frames
                .iter()
                .take(max_frames)
                .map(ToString::to_string)
                .collect();
            line.push_str(&shown.join(" ← "));
            let more = frames.len().saturating_sub(max_frames);
            if more > 0 {
                let _ = write!(line, " ← … {more} more");
            }
        }
        line
    }
}

/// Every process, thread and frame, one per line, as the run's log folder keeps them.
impl fmt::Display for TaskStacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for process in &self.processes {
            writeln!(f, "Process {}: {}", process.pid, process.command)?;
            for thread in &process.threads {
                write!(
                    f,
                    "  Thread {} \"{}\" ({} {}",
                    thread.tid,
                    thread.name,
                    thread.state,
                    state_name(&thread.state)
                )?;
                match &thread.wchan {
                    Some(wchan) => writeln!(f, ", waits in {wchan})")?,
                    None => writeln!(f, ")")?,
                }
                for frame in &thread.frames {
                    writeln!(f, "      {frame}")?;
                }
            }
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(function: &str, file: &str) -> Frame {
        Frame {
            function: function.into(),
            file: Some(file.into()),
            line: None,
        }
    }

    fn python(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            file: Some(file.into()),
            line: Some(line),
        }
    }

    #[test]
    fn a_summary_shows_python_frames_after_the_builtin_they_called() {
        let sleeping = [
            native("clock_nanosleep", "libc.so.6"),
            native("time_sleep", "libpython3.11.so.1.0"),
            python("<module>", "hang.py", 11),
        ];
        let shown: Vec<String> = shown_frames(&sleeping)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            ["time_sleep (libpython3.11.so.1.0)", "<module> (hang.py:11)"]
        );
        let waiting = [
            native("pthread_cond_wait", "libc.so.6"),
            native("c10d::ProcessGroupGloo::wait", "libtorch_cpu.so"),
            native("pybind11::cpp_function::dispatcher", "libtorch_python.so"),
            python("all_reduce", "torch/distributed/distributed_c10d.py", 4181),
            native("_PyEval_EvalFrameDefault", "libpython3.11.so.1.0"),
            python("<module>", "hang.py", 12),
        ];
        let shown: Vec<String> = shown_frames(&waiting)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "all_reduce (torch/distributed/distributed_c10d.py:4181)",
                "<module> (hang.py:12)"
            ]
        );
        let rust = [native("nanosleep", "libc.so.6"), native("main", "app")];
        assert_eq!(
            shown_frames(&rust).len(),
            2,
            "without Python every frame shows"
        );
    }
}
