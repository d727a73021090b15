//! The `trainyard` command line.

mod args;
mod plan;

use std::error::Error;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use trainyard_config::resources::ErrorChain;

use crate::args::{Cli, Command};

/// Exit code for a failure that is not the input's fault, such as an unwritable stdout.
const EXIT_FAILURE: u8 = 1;

/// Exit code for bad input: flags, config files, resources.
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
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
            eprintln!("error: {}", missing_subcommand());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Err(err) => {
            eprintln!("{}", one_line(&err.render().to_string()));
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let result = match cli.command {
        Command::Plan(args) => plan::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let message = ErrorChain(failure.error.as_ref()).to_string();
            eprintln!("error: {}", escape_newlines(&message));
            ExitCode::from(failure.code)
        }
    }
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

/// `text` with line breaks written as `\n`, so that an error is always one line.
pub(crate) fn escape_newlines(text: &str) -> String {
    text.replace('\r', "\\r").replace('\n', "\\n")
}

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

    /// Bad input (exit code 2).
    pub(crate) fn bad_input(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            code: EXIT_BAD_INPUT,
            error: error.into(),
        }
    }
}

/// Writing the result to stdout failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout")]
struct OutputError(#[source] std::io::Error);

/// clap's multi-line usage error folded into one line (the usage hint is dropped).
fn one_line(rendered: &str) -> String {
    rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .filter(|line| !line.is_empty() && !line.starts_with("tip:"))
        .collect::<Vec<_>>()
        .join(" ")
}
