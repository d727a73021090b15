//! `trainyard plan`: resolve a scaling config and print it; with `--runtime local` or
//! `--cluster FILE`, also place it on that cluster, reserving nothing.

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write as _};
use std::path::Path;

use serde::{Deserialize, Serialize};
use trainyard::backend::workers_that_fit;
use trainyard::local::ledger::{self, LedgerLocation, RunEntry};
use trainyard::runtime::reservations::{NodeSpec, Reservations};
use trainyard::runtime::{NodeInfo, PlacementGroupFactory, RuntimeError, Shortage};
use trainyard_config::Plan;
use trainyard_config::resources::{GPU, Resources};
use trainyard_config::{Format, ScalingConfig};

use crate::args::{OutputFormat, PlanArgs, RuntimeKind};
use crate::values::FlagError;
use crate::{EXIT_UNSCHEDULABLE, Failure};

/// The most nodes a described cluster may have.
const MAX_DESCRIBED_NODES: u32 = 100_000;

/// A cluster described in a file: its nodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    nodes: Vec<NodeEntry>,
}

/// One node of a described cluster, or `count` alike ones.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    id: Option<String>,
    #[serde(default = "one")]
    count: u32,
    resources: Resources,
}

const fn one() -> u32 {
    1
}

/// A plan that can never be placed on the cluster it was placed on: nothing ran.
#[derive(Debug, thiserror::Error)]
#[error("the workers cannot be scheduled on {cluster}")]
struct Unschedulable {
    /// The cluster's name.
    cluster: String,
    /// Why not.
    #[source]
    source: RuntimeError,
}

/// Exit 3 with why the plan can never be placed on `cluster`.
fn unschedulable(cluster: &str, source: RuntimeError) -> Failure {
    Failure::new(
        EXIT_UNSCHEDULABLE,
        Unschedulable {
            cluster: cluster.to_owned(),
            source,
        },
    )
}

/// Where the plan's bundles land, or what it waits for.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum Placement {
    /// Each bundle's node, by bundle index.
    Placed {
        cluster: String,
        bundle_nodes: Vec<String>,
    },
    /// It fits the cluster, but not what other runs leave free now.
    Waits { cluster: String, shortage: Shortage },
}

pub(crate) fn run(args: &PlanArgs) -> Result<(), Failure> {
    let config = args.scaling.to_config()?;
    let plan = config.plan().map_err(Failure::bad_input)?;
    // An elastic plan is placed with as many workers as would start now.
    let mut starting = None;
    let mut start = |free: Vec<Resources>| -> Result<PlacementGroupFactory, Failure> {
        let (factory, n) = starting_group(&config, &free)?;
        starting = Some(n);
        Ok(factory)
    };
    let placement = match (args.runtime, &args.cluster) {
        (Some(RuntimeKind::Ray), _) => Some(place_on_ray(args, &mut start)?),
        (Some(RuntimeKind::Slurm), _) => Some(place_on_slurm(args, &mut start)?),
        (Some(RuntimeKind::Local), _) => {
            let nodes = args.local.config("plan", None, false)?.node_specs();
            let others = other_runs()?;
            Some(place("local", nodes, &others, &mut start)?)
        }
        (None, Some(path)) => {
            let nodes = described_nodes(path)?;
            let name = path.display().to_string();
            Some(place(&name, nodes, &[], &mut start)?)
        }
        (None, None) => None,
    };
    let starting = starting.filter(|_| config.num_workers.is_elastic());
    match write_plan(&plan, placement.as_ref(), starting, args.format) {
        // A reader that stops early (`| head`) has all it wanted.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(Failure::output),
    }
}

/// The group a run of `config` would start with on nodes with `free` resources, and its
/// number of workers: the fixed number, or for an elastic run as many as fit (at least its
/// minimum).
fn starting_group(
    config: &ScalingConfig,
    free: &[Resources],
) -> Result<(PlacementGroupFactory, u32), Failure> {
    let n = workers_that_fit(config, free)
        .map_err(Failure::bad_input)?
        .unwrap_or(config.num_workers.min());
    let factory = config
        .placement_group_factory_for(n)
        .map_err(Failure::bad_input)?;
    Ok((factory, n))
}

/// The group to place, given each node's free resources.
type Starting<'a> = dyn FnMut(Vec<Resources>) -> Result<PlacementGroupFactory, Failure> + 'a;

/// Places the group `start` chooses on the Ray cluster as it is now: refused as `run` would
/// refuse it when it can never fit the live nodes; else on the nodes' free resources, or
/// what it waits for.
fn place_on_ray(args: &PlanArgs, start: &mut Starting<'_>) -> Result<Placement, Failure> {
    if let Some(flag) = args.local.given() {
        return Err(Failure::bad_input(FlagError::new(flag, "(given)")(
            "describes this machine and applies to --runtime local only".into(),
        )));
    }
    let snapshot = crate::engine::ray_snapshot(&args.ray)?;
    let cluster = format!("ray {}", args.ray.address().unwrap_or_default());
    let factory = start(free_of(&snapshot))?;
    place_on_snapshot(cluster, &snapshot, &factory)
}

/// Each node's free resources.
fn free_of(snapshot: &trainyard::runtime::ClusterSnapshot) -> Vec<Resources> {
    snapshot.nodes.iter().map(|n| n.available.clone()).collect()
}

/// Places the group `start` chooses on the Slurm partition's nodes as Slurm's node table
/// has them now.
fn place_on_slurm(args: &PlanArgs, start: &mut Starting<'_>) -> Result<Placement, Failure> {
    if let Some(flag) = args.local.given() {
        return Err(Failure::bad_input(FlagError::new(flag, "(given)")(
            "describes this machine and applies to --runtime local only".into(),
        )));
    }
    let snapshot = args.slurm.snapshot()?;
    let cluster = format!(
        "slurm {}",
        args.slurm
            .partition
            .as_deref()
            .unwrap_or("(default partition)")
    );
    let factory = trainyard::slurm::request::slurm_factory(&start(free_of(&snapshot))?);
    place_on_snapshot(cluster, &snapshot, &factory)
}

/// Places `factory` on the cluster `snapshot` shows: refused as `run` would refuse it when
/// it can never fit the live nodes; else on the nodes' free resources, or what it waits for.
fn place_on_snapshot(
    cluster: String,
    snapshot: &trainyard::runtime::ClusterSnapshot,
    factory: &PlacementGroupFactory,
) -> Result<Placement, Failure> {
    let spec = |node: &NodeInfo, resources: &Resources| NodeSpec {
        id: node.id.clone(),
        ip: node.ip.clone(),
        hostname: node.hostname.clone(),
        resources: resources.clone(),
        devices: BTreeMap::new(),
    };
    let totals: Vec<&Resources> = snapshot.nodes.iter().map(|n| &n.total).collect();
    if let Err(error) = trainyard::runtime::placement::check_feasible(&totals, factory) {
        return Err(unschedulable(&cluster, RuntimeError::Infeasible(error)));
    }
    let free: Vec<NodeSpec> = snapshot
        .nodes
        .iter()
        .map(|n| spec(n, &n.available))
        .collect();
    let mut book = Reservations::new(free);
    let placed = book
        .create_group(factory)
        .ok()
        .and_then(|pg| book.placement_info(pg).ok().flatten());
    if let Some(info) = placed {
        return Ok(Placement::Placed {
            cluster,
            bundle_nodes: info.bundle_nodes.iter().map(ToString::to_string).collect(),
        });
    }
    // What the free resources lack, summed over the cluster; all of it when they would be
    // enough but are split over nodes in a way the strategy cannot use.
    let demand = factory.total_resources().map_err(Failure::bad_input)?;
    let available = snapshot.available();
    let mut missing = Resources::new();
    for (name, wanted) in demand.iter() {
        let short = wanted.saturating_sub(available.amount(name));
        if !short.is_zero() {
            let _ = missing.insert(name, short);
        }
    }
    if missing.is_empty() {
        missing = demand;
    }
    let shortage = Shortage {
        pg: trainyard::runtime::PlacementGroupId(0),
        missing,
        holders: Vec::new(),
    };
    Ok(Placement::Waits { cluster, shortage })
}

/// What the live runs on this machine hold.
fn other_runs() -> Result<Vec<RunEntry>, Failure> {
    match LedgerLocation::from_env() {
        LedgerLocation::Off => Ok(Vec::new()),
        LedgerLocation::At(path) => ledger::live_runs(&path).map_err(Failure::other),
    }
}

/// Places the group `start` chooses on `nodes` less what `others` hold, as `run` would
/// reserve it.
fn place(
    cluster: &str,
    nodes: Vec<NodeSpec>,
    others: &[RunEntry],
    start: &mut Starting<'_>,
) -> Result<Placement, Failure> {
    let mut book = Reservations::new(nodes);
    book.set_held_elsewhere(others.iter().flat_map(|r| &r.bundles));
    let factory = start(free_of(&book.snapshot()))?;
    let pg = book
        .create_group(&factory)
        .map_err(|error| unschedulable(cluster, error))?;
    let cluster = cluster.to_owned();
    match book.placement_info(pg).map_err(Failure::other)? {
        Some(info) => Ok(Placement::Placed {
            cluster,
            bundle_nodes: info.bundle_nodes.iter().map(ToString::to_string).collect(),
        }),
        None => {
            let missing = book.shortfall(pg).unwrap_or_default();
            let shortage = ledger::shortage(pg, missing, others);
            Ok(Placement::Waits { cluster, shortage })
        }
    }
}

/// The nodes a cluster file describes: `count` copies of each entry, named by its `id`
/// (with `-N` added for copies) or `node-N`; a node with whole GPUs gets device ids `0..`.
fn described_nodes(path: &Path) -> Result<Vec<NodeSpec>, Failure> {
    let bad = |reason: String| {
        Failure::bad_input(FlagError::new("--cluster", &path.display().to_string())(
            reason.into(),
        ))
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let file: ClusterFile = Format::of_path(path)
        .parse(&text, Some(path))
        .map_err(Failure::bad_input)?;
    if file.nodes.is_empty() {
        return Err(bad("expected at least one entry in `nodes`".into()));
    }
    let total: u64 = file.nodes.iter().map(|n| u64::from(n.count)).sum();
    if file.nodes.iter().any(|n| n.count == 0) || total > u64::from(MAX_DESCRIBED_NODES) {
        return Err(bad(format!(
            "`count` must be at least 1 and the nodes at most {MAX_DESCRIBED_NODES} in all, got {total}"
        )));
    }
    let mut nodes: Vec<NodeSpec> = Vec::new();
    for entry in &file.nodes {
        entry.resources.validate().map_err(Failure::bad_input)?;
        for copy in 0..entry.count {
            let id = match (&entry.id, entry.count) {
                (Some(id), 1) => id.clone(),
                (Some(id), _) => format!("{id}-{copy}"),
                (None, _) => format!("node-{}", nodes.len()),
            };
            if nodes.iter().any(|n| n.id.as_str() == id) {
                return Err(bad(format!("node id `{id}` appears twice")));
            }
            let mut node = NodeSpec::new(&id, entry.resources.clone());
            if let Some(gpus) = entry.resources.amount(GPU).as_whole_u64() {
                let ids = (0..gpus).map(|i| i.to_string()).collect();
                node.devices = BTreeMap::from([(GPU.to_owned(), ids)]);
            }
            nodes.push(node);
        }
    }
    Ok(nodes)
}

/// Writes the plan (and its placement, with how many workers an elastic run would start
/// with) to stdout in `format`.
fn write_plan(
    plan: &Plan,
    placement: Option<&Placement>,
    starting: Option<u32>,
    format: OutputFormat,
) -> io::Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    match format {
        OutputFormat::Json => {
            let mut value = serde_json::to_value(plan).map_err(io::Error::other)?;
            if let (Some(placement), Some(object)) = (placement, value.as_object_mut()) {
                let placement = serde_json::to_value(placement).map_err(io::Error::other)?;
                object.insert("placement".to_owned(), placement);
                if let Some(n) = starting {
                    object.insert("starting_workers".to_owned(), n.into());
                }
            }
            serde_json::to_writer_pretty(&mut out, &value)?;
        }
        OutputFormat::Text => {
            write!(out, "{plan}")?;
            if let Some(placement) = placement {
                if let Some(n) = starting {
                    let range = plan.scaling_config.num_workers;
                    write!(
                        out,
                        "\n\nwould start with {n} of {range} workers (as many as fit now)"
                    )?;
                }
                write_placement(&mut out, plan, placement)?;
            }
        }
    }
    writeln!(out)?;
    out.flush()
}

fn write_placement(out: &mut impl io::Write, plan: &Plan, placement: &Placement) -> io::Result<()> {
    let bundles = &plan.placement_group_factory.bundles;
    match placement {
        Placement::Placed {
            cluster,
            bundle_nodes,
        } => {
            write!(out, "\nplacement on {cluster}:")?;
            for (index, (bundle, node)) in bundles.iter().zip(bundle_nodes).enumerate() {
                write!(out, "\n  bundle {index} ({}) -> {node}", bundle.human())?;
            }
        }
        Placement::Waits { cluster, shortage } => {
            write!(out, "\nplacement on {cluster}: would wait: {shortage}")?;
        }
    }
    Ok(())
}
