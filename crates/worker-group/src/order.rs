//! Worker ordering by node and GPU id: a pure function over worker metadata.

use std::cmp::Ordering;
use std::collections::HashMap;

use trainyard_runtime::NodeId;

use crate::WorkerMetadata;

/// The accelerator resource whose ids order the workers of one node.
const GPU: &str = "GPU";

/// The order of workers that Ray Train's `sort_workers_by_node_id_and_gpu_id` produces,
/// as a permutation: `order[k]` is the old index of the worker that goes to position `k`.
///
/// Workers are grouped by node id, the groups in order of first appearance (the group of
/// `first_node` first, even when no worker runs there); within a node they are sorted,
/// stably, by their lowest GPU id. GPU ids compare as numbers when they all parse as
/// integers and as text otherwise; a worker without GPU ids keys as `0`, so CPU-only
/// workers keep their order. Where one node mixes numeric and textual keys, numeric keys
/// come first.
///
/// ```
/// use trainyard_runtime::NodeId;
/// use trainyard_worker_group::{WorkerMetadata, node_and_gpu_order};
///
/// let on = |node: &str| WorkerMetadata {
///     node_id: NodeId::from(node),
///     node_ip: "10.0.0.1".into(),
///     interface: None,
///     hostname: "host".into(),
///     pid: 1,
///     task_pid: None,
///     accelerator_ids: Default::default(),
/// };
/// let workers = [on("b"), on("a"), on("b")];
/// let refs: Vec<&WorkerMetadata> = workers.iter().collect();
/// assert_eq!(node_and_gpu_order(&refs, None), [0, 2, 1]);
/// assert_eq!(node_and_gpu_order(&refs, Some(&NodeId::from("a"))), [1, 0, 2]);
/// ```
#[must_use]
pub fn node_and_gpu_order(metadata: &[&WorkerMetadata], first_node: Option<&NodeId>) -> Vec<usize> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<&NodeId, usize> = HashMap::new();
    if let Some(first) = first_node {
        group_of.insert(first, 0);
        groups.push(Vec::new());
    }
    for (index, worker) in metadata.iter().enumerate() {
        let group = *group_of.entry(&worker.node_id).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(index);
    }
    let keys: Vec<GpuKey<'_>> = metadata.iter().map(|worker| GpuKey::of(worker)).collect();
    groups
        .into_iter()
        .flat_map(|mut members| {
            // `sort_by` is stable: workers with equal keys keep their order.
            members.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
            members
        })
        .collect()
}

/// A worker's lowest GPU id, as Ray Train compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GpuKey<'a> {
    /// Every id is an integer (or there are none, which keys as 0).
    Number(i128),
    /// Some id is not an integer: the smallest id as text.
    Text(&'a str),
}

impl<'a> GpuKey<'a> {
    fn of(worker: &'a WorkerMetadata) -> Self {
        let ids = worker
            .accelerator_ids
            .get(GPU)
            .map_or(&[][..], Vec::as_slice);
        let numbers: Option<Vec<i128>> = ids.iter().map(|id| id.trim().parse().ok()).collect();
        match numbers {
            Some(numbers) => Self::Number(numbers.into_iter().min().unwrap_or(0)),
            // `ids` is not empty here: an empty list parses to `Some`.
            None => Self::Text(ids.iter().map(String::as_str).min().unwrap_or("")),
        }
    }
}

impl Ord for GpuKey<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Number(a), Self::Number(b)) => a.cmp(b),
            (Self::Text(a), Self::Text(b)) => a.cmp(b),
            (Self::Number(_), Self::Text(_)) => Ordering::Less,
            (Self::Text(_), Self::Number(_)) => Ordering::Greater,
        }
    }
}

impl PartialOrd for GpuKey<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
