//! `trainyard plan`: resolve a scaling config and print it.

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write as _};

use trainyard_config::Plan;
use trainyard_config::resources::{ActorOptions, ByteSize};

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

/// Writes the plan to stdout in `format`.
fn write_plan(plan: &Plan, format: OutputFormat) -> io::Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    match format {
        OutputFormat::Json => serde_json::to_writer_pretty(&mut out, plan)?,
        OutputFormat::Text => out.write_all(render_text(plan).as_bytes())?,
    }
    writeln!(out)?;
    out.flush()
}

fn dict(resources: &trainyard_config::resources::Resources) -> String {
    if resources.is_empty() {
        "{}".to_owned()
    } else {
        format!("{resources:#}")
    }
}

fn options(o: &ActorOptions) -> String {
    let object_store = o
        .object_store_memory
        .map_or_else(|| "-".to_owned(), |b| format!("{:#}", ByteSize::new(b)));
    format!(
        "num_cpus={} num_gpus={} memory={:#} object_store_memory={} resources={}",
        o.num_cpus,
        o.num_gpus,
        ByteSize::new(o.memory),
        object_store,
        dict(&o.resources)
    )
}

/// A readable summary followed by one row per bundle.
fn render_text(plan: &Plan) -> String {
    let config = &plan.scaling_config;
    let factory = &plan.placement_group_factory;
    let per_worker = config.resources_per_worker.clone().unwrap_or_default();
    let trainer = config.trainer_resources.clone().unwrap_or_default();
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(out, "workers             {}", config.num_workers);
    let _ = writeln!(out, "use_gpu             {}", config.use_gpu);
    let _ = writeln!(out, "placement_strategy  {}", factory.strategy);
    let _ = writeln!(out, "per worker          {}", dict(&per_worker));
    let _ = writeln!(out, "trainer             {}", dict(&trainer));
    let _ = writeln!(out, "total               {}", dict(&plan.total_resources));
    let bundles: Vec<String> = factory.bundles.iter().map(dict).collect();
    let width = bundles
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max("bundle resources".len());
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "bundle  {:width$}  worker actor options",
        "bundle resources"
    );
    for (worker, bundle) in plan.workers.iter().zip(&bundles) {
        let _ = writeln!(
            out,
            "{:<6}  {bundle:width$}  {}",
            worker.bundle_index,
            options(&worker.actor_options)
        );
    }
    out.truncate(out.trim_end().len());
    out
}
