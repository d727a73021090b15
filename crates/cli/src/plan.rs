//! `trainyard plan`: resolve a scaling config and print it.

use std::io::{self, BufWriter, Write as _};

use trainyard_config::Plan;

use crate::Failure;
use crate::args::{OutputFormat, PlanArgs};

pub(crate) fn run(args: &PlanArgs) -> Result<(), Failure> {
    let config = args.scaling.to_config()?;
    let plan = config.plan().map_err(Failure::bad_input)?;
    match write_plan(&plan, args.format) {
        // A reader that stops early (`| head`) has all it wanted.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(Failure::output),
    }
}

/// Writes the plan to stdout in `format`: the library's JSON form or its `Display` text.
fn write_plan(plan: &Plan, format: OutputFormat) -> io::Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    match format {
        OutputFormat::Json => serde_json::to_writer_pretty(&mut out, plan)?,
        OutputFormat::Text => write!(out, "{plan}")?,
    }
    writeln!(out)?;
    out.flush()
}
