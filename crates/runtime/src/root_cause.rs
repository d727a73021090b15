//! Why a task failed, in the program's own words: the exception a Python program left in
//! torch's error file (`TORCHELASTIC_ERROR_FILE`, written by `@record`), or the last
//! traceback it printed.

use serde::{Deserialize, Serialize};

/// The variable a backend sets to ask workers for an error file: its value names the
/// variable that gets the file's path (the torch backend sets it to
/// [`TORCHELASTIC_ERROR_FILE`]). The worker makes a fresh path for every task and reads the
/// file when the task fails.
pub const ERROR_FILE_VAR: &str = "TRAINYARD_ERROR_FILE_VAR";

/// Where torch's `@record` writes the exception that ended a program.
pub const TORCHELASTIC_ERROR_FILE: &str = "TORCHELASTIC_ERROR_FILE";

/// The first line of a Python traceback.
const TRACEBACK_START: &str = "Traceback (most recent call last):";

/// Where a [`TaskError`] was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorSource {
    /// torch's error file, written by a program decorated with `@record`.
    ErrorFile,
    /// The last traceback in the task's output.
    Output,
}

/// The exception a failed task left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    /// Where it was read.
    pub source: ErrorSource,
    /// The exception's type (`ValueError`).
    pub exception: String,
    /// Its message (`bad batch`); empty when it has none.
    pub message: String,
    /// The file of the innermost frame of its traceback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// That frame's line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The whole traceback, one line a string.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traceback: Vec<String>,
}

impl std::fmt::Display for TaskError {
    /// `ValueError: bad batch (train.py:12)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.exception)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, " ({file}:{line})"),
            (Some(file), None) => write!(f, " ({file})"),
            _ => Ok(()),
        }
    }
}

impl TaskError {
    /// Reads torch's error file (`{"message": {"message": "ValueError: bad batch",
    /// "extraInfo": {"py_callstack": "Traceback ...", ...}}}`); `None` when it is not one.
    ///
    /// ```
    /// use trainyard_runtime::root_cause::{ErrorSource, TaskError};
    ///
    /// let file = r#"{"message": {"message": "ValueError: bad batch", "extraInfo": {
    ///     "py_callstack": "Traceback (most recent call last):\n  File \"/w/train.py\", line 12, in main\n    raise ValueError(\"bad batch\")\nValueError: bad batch\n",
    ///     "timestamp": "1764612000"}}}"#;
    /// let error = TaskError::from_error_file(file).unwrap();
    /// assert_eq!(error.source, ErrorSource::ErrorFile);
    /// assert_eq!(error.to_string(), "ValueError: bad batch (/w/train.py:12)");
    /// ```
    #[must_use]
    pub fn from_error_file(text: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let message = &value["message"];
        // An older format keeps the message as a plain string.
        let (headline, callstack) = match message {
            serde_json::Value::String(s) => (s.as_str(), ""),
            _ => (
                message["message"].as_str()?,
                message["extraInfo"]["py_callstack"]
                    .as_str()
                    .unwrap_or_default(),
            ),
        };
        let traceback: Vec<String> = callstack.lines().map(str::to_owned).collect();
        let (file, line) = innermost_frame(&traceback);
        let (exception, message) = split_exception(headline);
        Some(Self {
            source: ErrorSource::ErrorFile,
            exception,
            message,
            file,
            line,
            traceback,
        })
    }
}

/// `ValueError: bad batch` → (`ValueError`, `bad batch`); a line without a message is all
/// exception.
fn split_exception(line: &str) -> (String, String) {
    let line = line.trim_end();
    match line.split_once(": ") {
        Some((exception, message))
            if !exception.is_empty()
                && exception
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '.') =>
        {
            (exception.to_owned(), message.to_owned())
        }
        _ => (line.to_owned(), String::new()),
    }
}

/// The file and line of the last `File "...", line N` of a traceback.
fn innermost_frame(traceback: &[String]) -> (Option<String>, Option<u32>) {
    traceback
        .iter()
        .rev()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix("File \"")?;
            let (file, rest) = rest.split_once('"')?;
            let number = rest
                .strip_prefix(", line ")
                .map(|r| r.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""))
                .and_then(|n| n.parse().ok());
            Some((Some(file.to_owned()), number))
        })
        .unwrap_or((None, None))
}

/// Follows a task's output and keeps its last complete Python traceback.
///
/// ```
/// use trainyard_runtime::root_cause::Tracebacks;
///
/// let mut tracebacks = Tracebacks::default();
/// for line in [
///     "step 3",
///     "Traceback (most recent call last):",
///     "  File \"/w/train.py\", line 12, in <module>",
///     "    raise ValueError(\"bad batch\")",
///     "ValueError: bad batch",
///     "shutting down",
/// ] {
///     tracebacks.push(line);
/// }
/// let error = tracebacks.last().unwrap();
/// assert_eq!(error.to_string(), "ValueError: bad batch (/w/train.py:12)");
/// assert!(!tracebacks.is_open());
///
/// // torch prints a rank's uncaught exception with a prefix on every line.
/// for line in [
///     "[rank1]: Traceback (most recent call last):",
///     "[rank1]:   File \"/w/train.py\", line 30, in load",
///     "[rank1]:     raise KeyError(\"img_7\")",
///     "[rank1]: KeyError: 'img_7'",
/// ] {
///     tracebacks.push(line);
/// }
/// let error = tracebacks.last().unwrap();
/// assert_eq!(error.to_string(), "KeyError: 'img_7' (/w/train.py:30)");
/// assert_eq!(error.traceback[0], "Traceback (most recent call last):");
/// ```
#[derive(Debug, Default, Clone)]
pub struct Tracebacks {
    /// The traceback being read, until its exception line.
    open: Option<Vec<String>>,
    /// What its lines start with before the traceback's own text (torch prints `[rank1]: `).
    prefix: String,
    /// The last complete one.
    last: Option<TaskError>,
}

/// How many lines of one traceback are kept; a deeper one keeps its innermost frames.
const MAX_TRACEBACK_LINES: usize = 200;

impl Tracebacks {
    /// Takes in one line of output.
    pub fn push(&mut self, line: &str) {
        if let Some(at) = line.find(TRACEBACK_START) {
            if line[at..].trim_end() == TRACEBACK_START {
                self.prefix = line[..at].to_owned();
                self.open = Some(vec![TRACEBACK_START.to_owned()]);
                return;
            }
        }
        let Some(open) = &mut self.open else {
            return;
        };
        let line = line.strip_prefix(self.prefix.as_str()).unwrap_or(line);
        if line.starts_with(' ') || line.starts_with('\t') || line.is_empty() {
            if open.len() == MAX_TRACEBACK_LINES {
                open.remove(1);
            }
            open.push(line.to_owned());
            return;
        }
        let mut traceback = std::mem::take(open);
        self.open = None;
        traceback.push(line.to_owned());
        let (file, number) = innermost_frame(&traceback);
        let (exception, message) = split_exception(line);
        self.last = Some(TaskError {
            source: ErrorSource::Output,
            exception,
            message,
            file,
            line: number,
            traceback,
        });
    }

    /// Whether a traceback has begun and its exception line has not come yet.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The last complete traceback.
    #[must_use]
    pub fn last(&self) -> Option<&TaskError> {
        self.last.as_ref()
    }
}
