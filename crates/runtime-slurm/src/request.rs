//! What to ask Slurm for: a worker's resources in Slurm's units, and the allocation that
//! holds a placement group, shaped after its strategy.
//!
//! Slurm hands out whole CPUs and memory in MiB, so every bundle is first rounded up to
//! them ([`slurm_bundle`]; a bundle without CPUs still gets one, since every job step runs
//! on at least one). The bundles are then laid over the partition's nodes by the group's own
//! strategy ([`place`]): `STRICT_PACK` on one node, `STRICT_SPREAD` one bundle per node,
//! `SPREAD` over as many nodes as it can, `PACK` over as few. The allocation asks for that
//! many nodes, each with what the fullest of them needs (`-N K --ntasks-per-node 1 -c C
//! --mem M`), so that the same placement fits inside it however Slurm picks the nodes;
//! bundles of different sizes (the trainer's resources on bundle 0) only make the others'
//! nodes a little roomier than they need.

use trainyard_config::PlacementGroupFactory;
use trainyard_resources::{CPU, GPU, MEMORY, ResourceAmount, Resources};
use trainyard_runtime::placement::{PlacementError, check_feasible, place};

use crate::slurm::MIB;

/// `amount` rounded up to a whole number.
fn ceil_units(amount: ResourceAmount) -> u64 {
    let whole = u64::try_from(amount.whole_units()).unwrap_or(u64::MAX);
    if amount.is_whole() {
        whole
    } else {
        whole.saturating_add(1)
    }
}

/// A bundle in Slurm's units: CPUs rounded up to whole ones (at least 1), memory up to
/// whole MiB, GPUs up to whole ones; other resources as they are.
#[must_use]
pub fn slurm_bundle(bundle: &Resources) -> Resources {
    let mut out = bundle.clone();
    let cpus = ceil_units(bundle.amount(CPU)).max(1);
    let _ = out.insert(CPU, ResourceAmount::from_units(cpus));
    let memory = ceil_units(bundle.amount(MEMORY));
    if memory > 0 {
        let _ = out.insert(
            MEMORY,
            ResourceAmount::from_units(memory.div_ceil(MIB).saturating_mul(MIB)),
        );
    }
    let gpus = ceil_units(bundle.amount(GPU));
    if gpus > 0 {
        let _ = out.insert(GPU, ResourceAmount::from_units(gpus));
    }
    out
}

/// `factory` with every bundle in Slurm's units.
#[must_use]
pub fn slurm_factory(factory: &PlacementGroupFactory) -> PlacementGroupFactory {
    PlacementGroupFactory {
        bundles: factory.bundles.iter().map(slurm_bundle).collect(),
        strategy: factory.strategy,
    }
}

/// The allocation that holds a placement group: `nodes` nodes with at least this much each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// How many nodes.
    pub nodes: usize,
    /// CPUs on each.
    pub cpus: u64,
    /// Memory on each, in MiB (0: Slurm's default).
    pub memory_mb: u64,
    /// GPUs on each.
    pub gpus: u64,
}

impl Shape {
    /// The shape for `factory` on a partition whose nodes have `totals` (all they have).
    ///
    /// # Errors
    /// The [`PlacementError`] of a group that no set of the partition's nodes can ever
    /// hold: naming the bundle, the resource and the largest node.
    pub fn for_group(
        factory: &PlacementGroupFactory,
        totals: &[Resources],
    ) -> Result<Self, PlacementError> {
        // As asked first, for an error in the user's own amounts.
        check_feasible(totals, factory)?;
        let factory = slurm_factory(factory);
        check_feasible(totals, &factory)?;
        // Feasible on totals, so a layout exists; `place` finds the strategy's own.
        let layout =
            place(totals, &factory).unwrap_or_else(|| (0..factory.bundles.len()).collect());
        let mut per_node: Vec<(usize, Resources)> = Vec::new();
        for (bundle, node) in factory.bundles.iter().zip(layout) {
            match per_node.iter_mut().find(|(n, _)| *n == node) {
                Some((_, sum)) => {
                    let _ = sum.checked_add_assign(bundle);
                }
                None => per_node.push((node, bundle.clone())),
            }
        }
        let most = |name: &str| {
            per_node
                .iter()
                .map(|(_, sum)| ceil_units(sum.amount(name)))
                .max()
                .unwrap_or(0)
        };
        Ok(Self {
            nodes: per_node.len().max(1),
            cpus: most(CPU).max(1),
            memory_mb: most(MEMORY).div_ceil(MIB),
            gpus: most(GPU),
        })
    }

    /// The options of `salloc`/`sbatch` that ask for it.
    #[must_use]
    pub fn flags(&self) -> Vec<String> {
        let mut flags = vec![
            format!("--nodes={}", self.nodes),
            "--ntasks-per-node=1".to_owned(),
            format!("--cpus-per-task={}", self.cpus),
        ];
        if self.memory_mb > 0 {
            flags.push(format!("--mem={}M", self.memory_mb));
        }
        if self.gpus > 0 {
            flags.push(format!("--gpus-per-node={}", self.gpus));
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use trainyard_config::PlacementStrategy;

    use super::*;

    fn nodes(n: usize, spec: &str) -> Vec<Resources> {
        vec![spec.parse().expect("spec"); n]
    }

    fn group(bundles: &[&str], strategy: PlacementStrategy) -> PlacementGroupFactory {
        PlacementGroupFactory {
            bundles: bundles.iter().map(|b| b.parse().expect("spec")).collect(),
            strategy,
        }
    }

    #[test]
    fn bundles_are_rounded_up_to_what_slurm_hands_out() {
        let bundle: Resources = "CPU=0.5,memory=1000000,GPU=0.5".parse().expect("spec");
        assert_eq!(
            slurm_bundle(&bundle),
            "CPU=1,memory=1MiB,GPU=1".parse().expect("spec")
        );
        let memory_only: Resources = "memory=200MiB".parse().expect("spec");
        assert_eq!(
            slurm_bundle(&memory_only),
            "CPU=1,memory=200MiB".parse().expect("spec")
        );
    }

    #[test]
    fn each_strategy_asks_for_its_own_number_of_nodes() {
        use PlacementStrategy::*;
        let four = nodes(4, "CPU=2,memory=4096MiB");
        let cases = [
            (Pack, vec!["CPU=1"; 4], 2, 2),
            (StrictPack, vec!["CPU=1"; 2], 1, 2),
            (Spread, vec!["CPU=1"; 2], 2, 1),
            (Spread, vec!["CPU=1"; 6], 4, 2),
            (StrictSpread, vec!["CPU=1"; 3], 3, 1),
        ];
        for (strategy, bundles, want_nodes, want_cpus) in cases {
            let shape = Shape::for_group(&group(&bundles, strategy), &four).expect("fits");
            assert_eq!(
                (shape.nodes, shape.cpus),
                (want_nodes, want_cpus),
                "{strategy} with {} bundles",
                bundles.len()
            );
        }
    }

    #[test]
    fn the_fullest_node_sets_the_shape_and_the_flags() {
        let four = nodes(4, "CPU=2,memory=4096MiB,GPU=2");
        let factory = group(
            &["CPU=2,memory=300MiB,GPU=1", "CPU=1,memory=100MiB,GPU=1"],
            PlacementStrategy::StrictSpread,
        );
        let shape = Shape::for_group(&factory, &four).expect("fits");
        assert_eq!(
            shape,
            Shape {
                nodes: 2,
                cpus: 2,
                memory_mb: 300,
                gpus: 1
            }
        );
        assert_eq!(
            shape.flags(),
            [
                "--nodes=2",
                "--ntasks-per-node=1",
                "--cpus-per-task=2",
                "--mem=300M",
                "--gpus-per-node=1"
            ]
        );
    }

    #[test]
    fn a_group_no_node_can_hold_names_the_bundle_and_the_largest_node() {
        let four = nodes(4, "CPU=2,memory=4096MiB");
        let error = Shape::for_group(&group(&["memory=100GB"], PlacementStrategy::Pack), &four)
            .expect_err("too big");
        let text = error.to_string();
        assert!(text.contains("bundle 0 needs memory=100GB"), "{text}");
        assert!(text.contains("4GiB"), "{text}");
        let error = Shape::for_group(
            &group(&["CPU=1"; 5], PlacementStrategy::StrictSpread),
            &four,
        )
        .expect_err("five nodes");
        assert!(error.to_string().contains("5"), "{error}");
    }
}
