//! `trainyard cluster`: the nodes of the local runtime and what each offers.

use std::fmt::Write as _;
use std::io::{self, Write as _};

use serde::Serialize;
use trainyard::local::ledger::{self, LedgerLocation};
use trainyard::runtime::Holder;
use trainyard_config::resources::Resources;

use crate::Failure;
use crate::args::{ClusterArgs, FlagError, OutputFormat, RuntimeKind};

/// One node as `cluster` shows it.
#[derive(Debug, Serialize)]
struct Node {
    id: String,
    ip: &'static str,
    resources: Resources,
    gpu_ids: Vec<String>,
}

pub(crate) fn run(args: &ClusterArgs) -> Result<(), Failure> {
    if args.runtime == RuntimeKind::Ray {
        return Err(Failure::bad_input(FlagError::new("--runtime", "ray")(
            "the Ray runtime is not part of this build yet; use --runtime local".into(),
        )));
    }
    let nodes: Vec<Node> = args
        .local
        .nodes()?
        .into_iter()
        .map(|n| Node {
            id: n.id.to_string(),
            ip: "127.0.0.1",
            resources: n.resources,
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
        OutputFormat::Text => render(&nodes, &runs),
    };
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(Failure::output),
    }
}

fn render(nodes: &[Node], runs: &[Holder]) -> String {
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
        let _ = writeln!(
            out,
            "{:width$}  {:9}  {:#}{gpus}",
            node.id, node.ip, node.resources
        );
    }
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
