//! The `trainyard` command line.

mod args;
mod plan;

use std::error::Error;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use trainyard_config::resources::ErrorChain;

use crate::args::{Cli, Command};

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
            eprintln!("error: {}", ErrorChain(failure.error.as_ref()));
            ExitCode::from(failure.code)
        }
    }
}

/// A command's failure: what went wrong and the exit code it maps to.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    error: Box<dyn Error + Send + Sync>,
}

impl Failure {
    /// Bad input (exit code 2).
    pub(crate) fn bad_input(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            code: EXIT_BAD_INPUT,
            error: error.into(),
        }
    }
}

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
