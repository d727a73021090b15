//! `trainyard cluster`: the nodes of the local runtime, of a Ray cluster or of a Slurm partition, what each offers,
//! and (on this machine) what the live runs hold.

use std::fmt::Write as _;
use std::io::{self, Write as _};

use serde::Serialize;
use trainyard::local::ledger::{self, LedgerLocation};
use trainyard::runtime::Holder;
use trainyard_config::resources::Resources;

use crate::Failure;
use crate::args::{ClusterArgs, OutputFormat, RuntimeKind};
use crate::values::FlagError;

/// One node as `cluster` shows it.
#[derive(Debug, Serialize)]
struct Node {
    id: String,
    ip: String,
    resources: Resources,
    /// What is free now, where the runtime tells (Ray).
    #[serde(skip_serializing_if = "Option::is_none")]
    available: Option<Resources>,
    gpu_ids: Vec<String>,
}

pub(crate) fn run(args: &ClusterArgs) -> Result<(), Failure> {
    if args.runtime != RuntimeKind::Slurm {
        if let Some((flag, value)) = args.slurm.given() {
            return Err(Failure::bad_input(FlagError::new(flag, value)(
                "applies to --runtime slurm only".into(),
            )));
        }
    }
    if matches!(args.runtime, RuntimeKind::Ray | RuntimeKind::Slurm) {
        return remote(args);
    }
    if let Some(address) = &args.ray.address {
        return Err(Failure::bad_input(FlagError::new("--address", address)(
            "--address names a Ray cluster and applies to --runtime ray only".into(),
        )));
    }
    let nodes: Vec<Node> = args
        .local
        .nodes()?
        .into_iter()
        .map(|n| Node {
            id: n.id.to_string(),
            ip: "127.0.0.1".to_owned(),
            resources: n.resources,
            available: None,
            gpu_ids: n.gpu_ids,
        })
        .collect();
    let runs: Vec<Holder> = match LedgerLocation::from_env() {
        LedgerLocation::Off => Vec::new(),
        LedgerLocation::At(path) => ledger::live_runs(&path)
            .map_err(Failure::other)?
            .iter()
            .map(ledger::holder)
            .collect(),
    };
    let text = match args.format {
        OutputFormat::Json => {
            serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes, "runs": runs }))
                .map_err(Failure::other)?
        }
        OutputFormat::Text => render(&nodes, Some(&runs)),
    };
    print(&text)
}

/// The live nodes of the Ray cluster at `--address` (or `$RAY_ADDRESS`), or of the Slurm
/// partition (`--partition`, else the default one; inside an allocation, its nodes with
/// what the job holds on each).
fn remote(args: &ClusterArgs) -> Result<(), Failure> {
    if let Some(flag) = args.local.given() {
        return Err(Failure::bad_input(FlagError::new(flag, "(given)")(
            "describes this machine and applies to --runtime local only".into(),
        )));
    }
    let snapshot = match args.runtime {
        RuntimeKind::Slurm => args.slurm.snapshot()?,
        _ => crate::engine::ray_snapshot(&args.ray)?,
    };
    let nodes: Vec<Node> = snapshot
        .nodes
        .into_iter()
        .map(|n| Node {
            id: n.id.to_string(),
            ip: n.ip,
            resources: n.total,
            available: Some(n.available),
            gpu_ids: Vec::new(),
        })
        .collect();
    let text = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes }))
            .map_err(Failure::other)?,
        OutputFormat::Text => render(&nodes, None),
    };
    print(&text)
}

fn print(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(Failure::output),
    }
}

/// The nodes as a table; `runs` are those holding this machine (none for a Ray cluster).
fn render(nodes: &[Node], runs: Option<&[Holder]>) -> String {
    let mut out = String::new();
    let width = nodes.iter().map(|n| n.id.len()).max().unwrap_or(4).max(4);
    // Writing into a String cannot fail.
    let _ = writeln!(out, "{:width$}  {:9}  resources", "node", "ip");
    for node in nodes {
        let gpus = if node.gpu_ids.is_empty() {
            String::new()
        } else {
            format!("  gpu_ids={}", node.gpu_ids.join(","))
        };
        let free = match &node.available {
            Some(available) => format!("  free: {}", available.human()),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "{:width$}  {:9}  {}{gpus}{free}",
            node.id,
            node.ip,
            node.resources.human()
        );
    }
    let Some(runs) = runs else {
        out.truncate(out.trim_end().len());
        return out;
    };
    if runs.is_empty() {
        let _ = writeln!(out, "\nno run holds anything on this machine");
    } else {
        let _ = writeln!(out, "\nheld by live runs:");
        for run in runs {
            let _ = writeln!(out, "  {run}");
        }
    }
    out.truncate(out.trim_end().len());
    out
}
