//! `trainyard cluster`: the nodes of the local runtime and what each offers.

use std::fmt::Write as _;
use std::io::{self, Write as _};

use serde::Serialize;
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
    let text = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes }))
            .map_err(Failure::other)?,
        OutputFormat::Text => render(&nodes),
    };
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(Failure::output),
    }
}

fn render(nodes: &[Node]) -> String {
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
    out.truncate(out.trim_end().len());
    out
}
