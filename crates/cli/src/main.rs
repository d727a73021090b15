//! The `trainyard` command line: `plan` a scaling config, `run` its workers, show the `cluster`,
//! list the runs (`ps`), `show`, `stop`, follow (`logs`) or look inside (`stacks`) one.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

/// `eprintln!` that never panics: a closed stderr (`trainyard run ... 2>&1 | head -1`) loses
/// the line instead of ending the driver before it has stopped its workers.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod args;
mod assets;
mod background;
mod cluster;
mod dashboard;
mod engine;
mod fold;
mod local;
mod logs;
mod notify;
mod output;
mod plan;
mod print;
mod ps;
mod run;
mod runs;
mod secrets;
mod show;
mod slurm;
mod stacks;
mod stop;
mod values;

use std::error::Error;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use trainyard_config::resources::ErrorChain;

use crate::args::{Cli, Command};

/// Exit code for a failure that is not the input's fault: the training failed, or stdout
/// cannot be written.
const EXIT_FAILURE: u8 = 1;

/// Exit code for bad input: flags, config files, resources, a program that does not exist.
const EXIT_BAD_INPUT: u8 = 2;

/// Exit code for a run that cannot be scheduled (infeasible, or the placement timed out).
const EXIT_UNSCHEDULABLE: u8 = 3;

/// Exit code for a run interrupted by SIGINT or SIGTERM.
const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    // The runtime starts this binary again as each worker's agent.
    if let Some(code) = trainyard::run_if_agent(trainyard::runtime::FunctionRegistry::new()) {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) =>
        {
            // Printing help or the version can only fail on a closed stdout.
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            say!("error: {}", missing_subcommand());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Err(err) => {
            // A value that a flag's own parser refused reads as any other bad flag.
            if let Some(failure) = values::refused_value(&err) {
                return failed(&failure);
            }
            say!("{}", one_line(&err.render().to_string()));
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let result = match cli.command {
        Command::Plan(args) => plan::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Cluster(args) => cluster::run(&args),
        Command::Ps(args) => ps::run(&args),
        Command::Stop(args) => stop::run(&args),
        Command::Show(args) => show::run(&args),
        Command::Logs(args) => logs::run(&args),
        Command::Stacks(args) => stacks::run(&args),
        Command::Dashboard(args) => dashboard::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failed(&failure),
    }
}

/// Says what went wrong on one `error:` line, and exits with the failure's code.
fn failed(failure: &Failure) -> ExitCode {
    if failure.error.is::<Said>() {
        return ExitCode::from(failure.code);
    }
    let message = ErrorChain(failure.error.as_ref()).to_string();
    say!("error: {}", inert(&message));
    ExitCode::from(failure.code)
}

/// What to say when no subcommand is given: the subcommands there are.
fn missing_subcommand() -> String {
    let command = Cli::command();
    let names: Vec<&str> = command
        .get_subcommands()
        .map(clap::Command::get_name)
        .filter(|name| *name != "help")
        .collect();
    format!(
        "a subcommand is required: {} (see {} --help)",
        names.join(", "),
        command.get_name()
    )
}

/// `text` made inert for a terminal, on one line: line breaks written as `\n` and `\r`, a
/// tab as `\t`, a backslash as `\\` (so that what is written as an escape was one), and every
/// other control character (an escape sequence's ESC, C1 controls such as CSI, DEL), every
/// bidirectional-text control, line or paragraph separator and zero-width character written
/// as `\u{..}`, so that nothing read from a run's files (another user's, or remote
/// storage's) can move the cursor, retitle the window, hide or reorder what is shown, or fake
/// a line of its own.
pub(crate) fn inert(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || is_format_control(c) => {
                let _ =
                    std::fmt::Write::write_fmt(&mut out, format_args!("\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out
}

/// `text`, each of its lines made [`inert`]: for text whose lines are its own (a stack dump).
pub(crate) fn inert_lines(text: &str) -> String {
    text.split('\n').map(inert).collect::<Vec<_>>().join("\n")
}

/// Whether `c` changes how the text around it is shown without showing itself: the
/// bidirectional-text controls (the "Trojan Source" characters), the line and paragraph
/// separators, and the zero-width characters.
fn is_format_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
    )
}

/// The error of a failure that has been told already.
#[derive(Debug, thiserror::Error)]
#[error("the failure was told already")]
struct Said;

/// A command's failure: what went wrong and the exit code it maps to.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    error: Box<dyn Error + Send + Sync>,
}

impl Failure {
    /// Output that cannot be written (exit code 1).
    pub(crate) fn output(error: std::io::Error) -> Self {
        Self {
            code: EXIT_FAILURE,
            error: Box::new(OutputError(error)),
        }
    }

    /// A failure with its own exit code.
    pub(crate) fn new(code: u8, error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            code,
            error: error.into(),
        }
    }

    /// A failure that is nobody's input (exit code 1).
    pub(crate) fn other(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self::new(EXIT_FAILURE, error)
    }

    /// What went wrong, on one line.
    pub(crate) fn message(&self) -> String {
        inert(&ErrorChain(self.error.as_ref()).to_string())
    }

    /// A failure that has been told already (another process printed it): only its code.
    pub(crate) fn said(code: u8) -> Self {
        Self::new(code, Said)
    }

    /// An interrupted run (exit code 130).
    pub(crate) fn interrupted() -> Self {
        Self::new(EXIT_INTERRUPTED, "interrupted; the workers were stopped")
    }

    /// A run interrupted while its runtime started (exit code 130).
    pub(crate) fn interrupted_starting() -> Self {
        Self::new(
            EXIT_INTERRUPTED,
            "interrupted while the runtime started; what it started was stopped",
        )
    }

    /// Bad input (exit code 2).
    pub(crate) fn bad_input(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            code: EXIT_BAD_INPUT,
            error: error.into(),
        }
    }

    /// The same failure, its message followed by `; hint`.
    pub(crate) fn with_hint(self, hint: String) -> Self {
        let message = ErrorChain(self.error.as_ref()).to_string();
        Self {
            code: self.code,
            error: format!("{message}; {hint}").into(),
        }
    }
}

/// Writing the result to stdout failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout")]
struct OutputError(#[source] std::io::Error);

/// clap's multi-line usage error folded into one line: the message and its context joined
/// by spaces, then each `tip:` (where clap says "a similar argument exists: ...") after a
/// `; `. The usage and the pointer to `--help` are dropped.
fn one_line(rendered: &str) -> String {
    let mut line = String::new();
    let parts = rendered
        .lines()
        .map(str::trim)
        .take_while(|part| !part.starts_with("Usage:") && !part.starts_with("For more information"))
        .filter(|part| !part.is_empty());
    for part in parts {
        if !line.is_empty() {
            line.push_str(if part.starts_with("tip:") { "; " } else { " " });
        }
        line.push_str(part);
    }
    inert(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inert_text_keeps_no_control_character_and_stays_on_one_line() {
        assert_eq!(
            inert("a\u{1b}]0;t\u{7}b\u{9b}1mc\u{202e}d\r\ne\tf\u{7f}"),
            "a\\u{1b}]0;t\\u{7}b\\u{9b}1mc\\u{202e}d\\r\\ne\\tf\\u{7f}"
        );
        assert_eq!(
            inert("x\\u{1b}\u{200b}\u{2028}\u{feff}"),
            "x\\\\u{1b}\\u{200b}\\u{2028}\\u{feff}"
        );
        assert_eq!(inert_lines("a\u{1b}\nb"), "a\\u{1b}\nb");
        assert_eq!(inert("loss=0.5 é ✓"), "loss=0.5 é ✓");
    }
}
