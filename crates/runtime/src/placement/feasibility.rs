//! The feasibility check: [`check_feasible`] decides whether a group can *ever* fit on the
//! cluster's totals and, when it cannot, explains the first rule it breaks as a
//! [`PlacementError`]. The searches it relies on live in the layout module.

use std::borrow::Borrow;

use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ResourceAmount, Resources};

use super::error::PlacementError;
use super::layout::Search;
use super::problem::{Problem, Shortfall};
use super::room::{DEVICE, device_fit, free, most_left, servable};

/// Whether the group described by `factory` can ever fit on nodes with these totals
/// (ignoring what is in use now).
///
/// The checks, in order: the cluster has nodes; each bundle fits on some node; the bundles
/// together fit in the cluster; `STRICT_PACK` fits on one node; `STRICT_SPREAD` finds a
/// node per bundle. For `PACK` and `SPREAD`, a group that passes these but for which
/// [`place`](crate::placement::place) finds no layout against the totals is refused only
/// when an exhaustive search proves that none exists (small groups, see
/// [`EXACT_SEARCH_BUNDLES`](crate::placement::EXACT_SEARCH_BUNDLES)); otherwise it is
/// accepted and waits like any group that does not fit now. A group is never refused that
/// could be placed.
///
/// # Errors
/// The first check that fails, as a [`PlacementError`] naming the bundle, the resource,
/// what was asked and the best a node offers.
pub fn check_feasible<R: Borrow<Resources>>(
    nodes_total: &[R],
    factory: &PlacementGroupFactory,
) -> Result<(), PlacementError> {
    let strategy = factory.strategy;
    let bundles = factory.bundles.len();
    if bundles == 0 {
        return Ok(());
    }
    if nodes_total.is_empty() {
        return Err(PlacementError::NoNodes { bundles, strategy });
    }
    let additive = Problem::additive(nodes_total, &factory.bundles);
    check_amounts(&additive, strategy)?;
    let problem = Problem::new(nodes_total, &factory.bundles);
    if problem.has_accelerators() {
        check_devices(&problem, strategy)?;
    }
    Ok(())
}

/// The checks on amounts alone, as if accelerators were not split into devices.
fn check_amounts(problem: &Problem, strategy: PlacementStrategy) -> Result<(), PlacementError> {
    let bundles = problem.bundles();

    // Each distinct bundle shape, checked once, reported for its first bundle.
    let mut checked = vec![false; problem.shapes.len()];
    for (bundle, &shape) in problem.shape_of.iter().enumerate() {
        if std::mem::replace(&mut checked[shape], true) {
            continue;
        }
        let demand = problem.dense(shape);
        if let Err(short) = problem.single_node_fit(&demand) {
            let at_fault = Subject::Bundle(bundle);
            return Err(explain(problem, short, &demand, at_fault, strategy));
        }
    }

    if let Some(missing) = problem.cluster_shortfall() {
        return Err(PlacementError::ClusterTooSmall {
            resource: problem.names[missing.index].clone(),
            needed: ResourceAmount::from_steps(missing.needed),
            total: ResourceAmount::from_steps(missing.have),
            strategy,
        });
    }

    match strategy {
        PlacementStrategy::StrictPack => {
            let total = problem.total_demand();
            if let Err(short) = problem.single_node_fit(&total) {
                let at_fault = Subject::Group(bundles);
                return Err(explain(problem, short, &total, at_fault, strategy));
            }
        }
        PlacementStrategy::StrictSpread => {
            if let Err(stuck) = problem.strict_spread() {
                return Err(PlacementError::NotEnoughDistinctNodes {
                    bundles: stuck.bundles,
                    group_bundles: bundles,
                    hosts: stuck.hosts,
                    strategy,
                });
            }
        }
        PlacementStrategy::Pack | PlacementStrategy::Spread => {
            if let Search::Impossible = problem.best_effort(strategy) {
                return Err(PlacementError::NoLayout { bundles, strategy });
            }
        }
    }
    Ok(())
}

/// The checks down to single devices: every accelerator amount of 1 or more is whole, and
/// the strategy's search finds a layout of bundles over devices (or gives up undecided).
fn check_devices(problem: &Problem, strategy: PlacementStrategy) -> Result<(), PlacementError> {
    for (bundle, &shape) in problem.shape_of.iter().enumerate() {
        if let Some((index, _, amount)) = problem
            .accelerator_entries(shape)
            .find(|&(_, _, a)| !servable(a))
        {
            return Err(PlacementError::NotWholeDevices {
                bundle,
                resource: problem.names[index].clone(),
                needed: ResourceAmount::from_steps(amount),
                strategy,
            });
        }
    }
    match problem.search(strategy) {
        Search::Found(_) | Search::Undecided => Ok(()),
        Search::Impossible => Err(explain_devices(problem, strategy)),
    }
}

/// Why a group that fits by amounts fits no devices: the first bundle that cannot join the
/// bundles before it, and what the best node offers per device once they are placed. When
/// the devices do not explain it, the rule the group breaks as a whole.
fn explain_devices(problem: &Problem, strategy: PlacementStrategy) -> PlacementError {
    let whole = || match (strategy, problem.strict_spread()) {
        (PlacementStrategy::StrictSpread, Err(stuck)) => PlacementError::NotEnoughDistinctNodes {
            bundles: stuck.bundles,
            group_bundles: problem.bundles(),
            hosts: stuck.hosts,
            strategy,
        },
        _ => PlacementError::NoLayout {
            bundles: problem.bundles(),
            strategy,
        },
    };
    let Some(culprit) = (1..=problem.bundles())
        .find(|&k| matches!(problem.prefix(k).search(strategy), Search::Impossible))
        .map(|k| k - 1)
    else {
        return whole();
    };
    let before = problem.prefix(culprit);
    let Search::Found(layout) = before.search(strategy) else {
        return whole();
    };
    let Some(picks) = before.assign(&layout) else {
        return whole();
    };
    let mut room = problem.room.clone();
    for (bundle, (&node, picks)) in layout.iter().zip(&picks).enumerate() {
        problem.take_with(&mut room, node, problem.shape_of[bundle], picks);
    }
    let candidates: Vec<usize> = (0..problem.node_count())
        .filter(|n| match strategy {
            PlacementStrategy::StrictPack => layout.first().is_none_or(|first| first == n),
            PlacementStrategy::StrictSpread => !layout.contains(n),
            PlacementStrategy::Pack | PlacementStrategy::Spread => true,
        })
        .collect();
    let shape = problem.shape_of[culprit];
    let stuck = problem
        .accelerator_entries(shape)
        .find(|&(_, slot, amount)| {
            candidates
                .iter()
                .all(|&n| !device_fit(problem.devices(&room, n, slot), amount))
        });
    let Some((index, slot, amount)) = stuck else {
        return whole();
    };
    let offer = |n: usize| {
        let list = problem.devices(&room, n, slot);
        if amount < DEVICE {
            most_left(list)
        } else {
            free(list) as u128
        }
    };
    let Some(node) = candidates
        .iter()
        .copied()
        .min_by_key(|&n| (std::cmp::Reverse(offer(n)), n))
    else {
        return whole();
    };
    let list = problem.devices(&room, node, slot);
    PlacementError::DeviceShortfall {
        bundle: culprit,
        resource: problem.names[index].clone(),
        needed: ResourceAmount::from_steps(amount),
        node,
        devices: list.len(),
        most_left: ResourceAmount::from_steps(most_left(list)),
        free: free(list),
        placed: culprit,
        strategy,
    }
}

/// What a [`Shortfall`] is about: one bundle, or a `STRICT_PACK` group of this many bundles.
#[derive(Clone, Copy)]
enum Subject {
    Bundle(usize),
    Group(usize),
}

/// The error for `demand` (dense) that fits no node, for one bundle or a whole group.
fn explain(
    problem: &Problem,
    short: Shortfall,
    demand: &[u128],
    subject: Subject,
    strategy: PlacementStrategy,
) -> PlacementError {
    match short {
        Shortfall::Resource(missing) => {
            let resource = problem.names[missing.index].clone();
            let needed = ResourceAmount::from_steps(missing.needed);
            let best = ResourceAmount::from_steps(missing.have);
            match subject {
                Subject::Bundle(bundle) => PlacementError::BundleTooLarge {
                    bundle,
                    resource,
                    needed,
                    best,
                    strategy,
                },
                Subject::Group(bundles) => PlacementError::GroupTooLargeForOneNode {
                    bundles,
                    resource,
                    needed,
                    best,
                    strategy,
                },
            }
        }
        Shortfall::Combination { closest } => {
            let nonzero = demand.iter().map(|&a| (a > 0).then_some(a));
            let demand = named(problem, nonzero);
            let closest = named(problem, problem.cap_of(closest).iter().copied().map(Some));
            match subject {
                Subject::Bundle(bundle) => PlacementError::BundleFitsNoNode {
                    bundle,
                    demand,
                    closest,
                    strategy,
                },
                Subject::Group(bundles) => PlacementError::GroupFitsNoNode {
                    bundles,
                    demand,
                    closest,
                    strategy,
                },
            }
        }
    }
}

/// Amounts by resource index as named resources; `None` entries are left out.
fn named(problem: &Problem, amounts: impl Iterator<Item = Option<u128>>) -> Resources {
    problem
        .names
        .iter()
        .zip(amounts)
        .filter_map(|(name, amount)| Some((name.clone(), ResourceAmount::from_steps(amount?))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{factory, nodes};
    use super::super::place;
    use super::*;

    #[test]
    fn zero_amounts_never_block() {
        let n = nodes(&["CPU=1"]);
        let f = factory(&["CPU=1,GPU=0,custom=0"], PlacementStrategy::StrictPack);
        assert_eq!(check_feasible(&n, &f), Ok(()));
    }

    #[test]
    fn a_bundle_too_large_for_every_node_names_bundle_resource_asked_and_best() {
        let n = nodes(&["CPU=4,memory=8000000000", "CPU=4,memory=4000000000"]);
        let f = factory(
            &["CPU=1", "CPU=1", "CPU=1,memory=10000000000"],
            PlacementStrategy::Pack,
        );
        let err = check_feasible(&n, &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bundle 2 needs memory=10GB but the most memory any node has is 8GB"
        );
        assert_eq!(err.bundle(), Some(2));
        assert_eq!(err.resource(), Some("memory"));
    }

    #[test]
    fn a_resource_no_node_has_is_named() {
        let err = check_feasible(
            &nodes(&["CPU=4"]),
            &factory(&["GPU=1"], PlacementStrategy::Spread),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "bundle 0 needs GPU=1 but no node has any GPU"
        );
    }

    #[test]
    fn a_bundle_whose_resources_live_on_different_nodes_is_explained() {
        let n = nodes(&["CPU=16,GPU=0", "CPU=4,GPU=8"]);
        let err =
            check_feasible(&n, &factory(&["CPU=8,GPU=4"], PlacementStrategy::Pack)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bundle 0 needs CPU=8,GPU=4 but no node has all of it at once; the closest has CPU=16,GPU=0"
        );
    }

    #[test]
    fn a_strict_pack_group_whose_resources_live_on_different_nodes_is_explained() {
        let n = nodes(&["CPU=16,GPU=0", "CPU=4,GPU=8"]);
        let f = factory(
            &["CPU=4,GPU=0", "CPU=4,GPU=4"],
            PlacementStrategy::StrictPack,
        );
        let err = check_feasible(&n, &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_PACK needs all 2 bundles on one node: together they need CPU=8,GPU=4 but no node has all of it at once; the closest has CPU=16,GPU=0"
        );
    }

    #[test]
    fn the_aggregate_is_checked_against_the_cluster() {
        let n = nodes(&["CPU=8,GPU=2", "CPU=8,GPU=2"]);
        let err =
            check_feasible(&n, &factory(&["GPU=2"; 3], PlacementStrategy::Spread)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the bundles together need GPU=6 but the cluster has GPU=4"
        );
    }

    #[test]
    fn strict_pack_must_fit_on_one_node() {
        let n = nodes(&["CPU=16", "CPU=16"]);
        let err =
            check_feasible(&n, &factory(&["CPU=4"; 5], PlacementStrategy::StrictPack)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_PACK needs all 5 bundles on one node: together they need CPU=20 but the most CPU any node has is 16"
        );
    }

    #[test]
    fn strict_spread_needs_enough_nodes() {
        let n = nodes(&["CPU=4"; 4]);
        let err = check_feasible(&n, &factory(&["CPU=1"; 5], PlacementStrategy::StrictSpread))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_SPREAD needs 5 distinct nodes but only 4 nodes can host a bundle"
        );
        let n = nodes(&["CPU=4", "CPU=4", "CPU=1", "CPU=1"]);
        let f = factory(
            &["CPU=1", "CPU=2", "CPU=2", "CPU=2"],
            PlacementStrategy::StrictSpread,
        );
        let err = check_feasible(&n, &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_SPREAD needs 3 distinct nodes for bundles 1, 2, 3 but only 2 nodes can host one of them"
        );
    }

    #[test]
    fn a_small_group_that_no_layout_fits_is_reported() {
        // Every rule passes but three 2-CPU bundles cannot share two 3-CPU nodes.
        let n = nodes(&["CPU=3", "CPU=3"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let err = check_feasible(&n, &factory(&["CPU=2"; 3], strategy)).unwrap_err();
            assert_eq!(
                err.to_string(),
                "no layout of the 3 bundles over the nodes exists, even with every node free"
            );
        }
    }

    #[test]
    fn a_group_that_first_fit_cannot_lay_out_is_feasible() {
        let n = nodes(&["CPU=4", "CPU=3"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let f = factory(&["CPU=3", "CPU=2", "CPU=2"], strategy);
            assert_eq!(check_feasible(&n, &f), Ok(()), "{strategy}");
        }
    }

    #[test]
    fn a_group_only_the_exhaustive_search_lays_out_is_feasible() {
        let n = nodes(&["CPU=6", "CPU=8"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let f = factory(&["CPU=3", "CPU=5", "CPU=2", "CPU=4"], strategy);
            assert_eq!(check_feasible(&n, &f), Ok(()), "{strategy}");
        }
    }

    #[test]
    fn a_large_group_that_passes_every_exact_check_is_not_called_infeasible() {
        // Twelve 2-CPU bundles on eight 3-CPU nodes: the totals match, every bundle fits a
        // node, but each node holds one. Too large to search exhaustively, so it is left to
        // wait rather than declared impossible on the heuristics' word.
        let n = nodes(&["CPU=3"; 8]);
        let f = factory(&["CPU=2"; 12], PlacementStrategy::Pack);
        assert_eq!(place(&n, &f), None);
        assert_eq!(check_feasible(&n, &f), Ok(()));
    }

    #[test]
    fn an_empty_cluster_is_reported() {
        let empty: Vec<Resources> = Vec::new();
        let err =
            check_feasible(&empty, &factory(&["CPU=1"], PlacementStrategy::Pack)).unwrap_err();
        assert_eq!(err.to_string(), "the cluster has no nodes to host 1 bundle");
    }
}
