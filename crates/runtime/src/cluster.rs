//! What a runtime knows about its cluster.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trainyard_resources::Resources;

use crate::{NodeId, PlacementGroupId};

/// Accelerator resource names whose device ids a runtime reports per worker.
pub const ACCELERATOR_RESOURCES: [&str; 5] = ["GPU", "neuron_cores", "TPU", "NPU", "HPU"];

/// One node of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Unique id; two nodes may share an IP, never an id.
    pub id: NodeId,
    /// Address other nodes reach this one at.
    pub ip: String,
    /// Host name.
    pub hostname: String,
    /// Everything the node has.
    pub total: Resources,
    /// What is neither reserved by a placement group nor used by an unpinned actor.
    pub available: Resources,
    /// Device ids per accelerator resource, such as `GPU → ["0", "1"]`.
    pub accelerator_ids: BTreeMap<String, Vec<String>>,
}

/// The nodes of a cluster at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSnapshot {
    /// The nodes, in a stable order.
    pub nodes: Vec<NodeInfo>,
}

impl ClusterSnapshot {
    /// The sum of every node's total resources.
    #[must_use]
    pub fn total(&self) -> Resources {
        sum(self.nodes.iter().map(|n| &n.total))
    }

    /// The sum of every node's available resources.
    #[must_use]
    pub fn available(&self) -> Resources {
        sum(self.nodes.iter().map(|n| &n.available))
    }

    /// The node with id `id`.
    #[must_use]
    pub fn node(&self, id: &NodeId) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| &n.id == id)
    }
}

fn sum<'a>(all: impl Iterator<Item = &'a Resources>) -> Resources {
    let mut out = Resources::new();
    for r in all {
        // Node totals are far below the overflow limit of 2^128 steps.
        let _ = out.checked_add_assign(r);
    }
    out
}

/// Another run on the same machine, and what it holds there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The run's name.
    pub run: String,
    /// Its driver's process id.
    pub pid: u32,
    /// Everything it holds.
    pub holds: Resources,
    /// The device ids it holds, per accelerator resource.
    pub devices: BTreeMap<String, Vec<String>>,
}

impl std::fmt::Display for Holder {
    /// `run `a` (pid 12) holds CPU=1, GPU=1 (GPU 0)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "run `{}` (pid {}) holds {}",
            self.run,
            self.pid,
            self.holds.human()
        )?;
        let devices: Vec<String> = self
            .devices
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(name, ids)| format!("{name} {}", ids.join(",")))
            .collect();
        if !devices.is_empty() {
            write!(f, " ({})", devices.join("; "))?;
        }
        Ok(())
    }
}

/// What a placement group that fits the machine waits for: what is not free now, and the
/// other runs that hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shortage {
    /// The waiting group.
    pub pg: PlacementGroupId,
    /// What it lacks now (everything it asks for when the free resources are split across
    /// nodes in a way its strategy cannot use).
    pub missing: Resources,
    /// The other runs that hold some of it.
    pub holders: Vec<Holder>,
}

impl std::fmt::Display for Shortage {
    /// `CPU=2 is not free: run `a` (pid 12) holds CPU=4; run `b` (pid 13) holds CPU=1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not free", self.missing.human())?;
        for (i, holder) in self.holders.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write!(f, "{holder}")?;
        }
        Ok(())
    }
}
