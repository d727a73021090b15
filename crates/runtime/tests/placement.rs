//! Placement semantics: properties over random clusters and groups, Ray's placement tests
//! (reference §7.2), device id sharing and the explanations of infeasible groups.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ResourceAmount, Resources};
use trainyard_runtime::placement::{
    AcceleratorPool, EXACT_SEARCH_BUNDLES, PlacementError, check_feasible, place,
};

fn res(text: &str) -> Resources {
    text.parse().expect("valid resources")
}

fn group(bundles: Vec<Resources>, strategy: PlacementStrategy) -> PlacementGroupFactory {
    PlacementGroupFactory { bundles, strategy }
}

/// An amount in quarter units, from 0 to `max_quarters` / 4.
fn quarters(max_quarters: u128) -> impl Strategy<Value = ResourceAmount> {
    (0..=max_quarters).prop_map(|q| ResourceAmount::from_steps(q * 2_500))
}

fn node() -> impl Strategy<Value = Resources> {
    (quarters(32), 0u64..4, prop::option::of(quarters(8))).prop_map(|(cpu, gpu, custom)| {
        let mut r = Resources::new().with("CPU", cpu).with("GPU", gpu);
        if let Some(c) = custom {
            r.insert("custom", c);
        }
        r
    })
}

fn bundle() -> impl Strategy<Value = Resources> {
    (
        quarters(12),
        prop::option::of(quarters(4)),
        prop::option::of(quarters(4)),
    )
        .prop_map(|(cpu, gpu, custom)| {
            let mut r = Resources::new().with("CPU", cpu);
            if let Some(g) = gpu {
                r.insert("GPU", g);
            }
            if let Some(c) = custom {
                r.insert("custom", c);
            }
            r
        })
}

/// Nodes and bundles in whole units of few resources, so that groups often fill the cluster
/// to the brim and the heuristics' mistakes show.
fn tight_node() -> impl Strategy<Value = Resources> {
    (1u64..=10, 0u64..=2).prop_map(|(cpu, gpu)| Resources::new().with("CPU", cpu).with("GPU", gpu))
}

fn tight_bundle() -> impl Strategy<Value = Resources> {
    (1u64..=6, prop::option::of(0u64..=1)).prop_map(|(cpu, gpu)| {
        let mut r = Resources::new().with("CPU", cpu);
        if let Some(g) = gpu {
            r.insert("GPU", ResourceAmount::from_units(g));
        }
        r
    })
}

fn strategy() -> impl Strategy<Value = PlacementStrategy> {
    prop::sample::select(PlacementStrategy::ALL.to_vec())
}

/// Whether the layout keeps every node within what it has.
fn within_capacity(nodes: &[Resources], bundles: &[Resources], layout: &[usize]) -> bool {
    let mut used: Vec<Resources> = vec![Resources::new(); nodes.len()];
    for (bundle, &node) in bundles.iter().zip(layout) {
        used[node].checked_add_assign(bundle).expect("small sums");
    }
    nodes
        .iter()
        .zip(&used)
        .all(|(have, used)| have.covers(used))
}

/// Whether some assignment of distinct nodes fits every bundle (brute force, small inputs).
fn distinct_layout_exists(nodes: &[Resources], bundles: &[Resources]) -> bool {
    fn go(nodes: &[Resources], bundles: &[Resources], taken: &mut Vec<bool>) -> bool {
        let Some((first, rest)) = bundles.split_first() else {
            return true;
        };
        for n in 0..nodes.len() {
            if !taken[n] && nodes[n].covers(first) {
                taken[n] = true;
                if go(nodes, rest, taken) {
                    return true;
                }
                taken[n] = false;
            }
        }
        false
    }
    go(nodes, bundles, &mut vec![false; nodes.len()])
}

/// Whether some layout, any at all, fits every bundle (brute force, small inputs).
fn any_layout_exists(nodes: &[Resources], bundles: &[Resources]) -> bool {
    fn go(left: &mut [Resources], bundles: &[Resources]) -> bool {
        let Some((first, rest)) = bundles.split_first() else {
            return true;
        };
        for n in 0..left.len() {
            if left[n].try_take(first).is_ok() {
                let found = go(left, rest);
                left[n].checked_add_assign(first).expect("small sums");
                if found {
                    return true;
                }
            }
        }
        false
    }
    go(&mut nodes.to_vec(), bundles)
}

/// Whether the group can be placed by its strategy's rule on an empty cluster, by brute force.
fn oracle(nodes: &[Resources], bundles: &[Resources], strategy: PlacementStrategy) -> bool {
    match strategy {
        PlacementStrategy::StrictPack => nodes.iter().any(|n| n.covers(&sum(bundles))),
        PlacementStrategy::StrictSpread => distinct_layout_exists(nodes, bundles),
        _ => any_layout_exists(nodes, bundles),
    }
}

fn sum(bundles: &[Resources]) -> Resources {
    let mut total = Resources::new();
    for b in bundles {
        total.checked_add_assign(b).expect("small sums");
    }
    total
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_reservation_never_over_commits_any_node_for_any_strategy(
        nodes in prop::collection::vec(node(), 1..8),
        bundles in prop::collection::vec(bundle(), 1..12),
        strategy in strategy(),
    ) {
        let factory = group(bundles.clone(), strategy);
        if let Some(layout) = place(&nodes, &factory) {
            prop_assert_eq!(layout.len(), bundles.len(), "a layout places every bundle or none");
            prop_assert!(layout.iter().all(|&n| n < nodes.len()));
            prop_assert!(within_capacity(&nodes, &bundles, &layout), "over-committed: {:?}", layout);
        }
    }

    #[test]
    fn strict_pack_places_all_bundles_on_one_node_or_fails(
        nodes in prop::collection::vec(node(), 1..8),
        bundles in prop::collection::vec(bundle(), 1..12),
    ) {
        let factory = group(bundles.clone(), PlacementStrategy::StrictPack);
        let total = sum(&bundles);
        match place(&nodes, &factory) {
            Some(layout) => {
                prop_assert!(layout.iter().all(|&n| n == layout[0]), "split over nodes: {:?}", layout);
            }
            None => prop_assert!(!nodes.iter().any(|n| n.covers(&total)), "a node could take them all"),
        }
    }

    #[test]
    fn strict_spread_uses_distinct_nodes_or_fails(
        nodes in prop::collection::vec(node(), 1..7),
        bundles in prop::collection::vec(bundle(), 1..7),
    ) {
        let factory = group(bundles.clone(), PlacementStrategy::StrictSpread);
        match place(&nodes, &factory) {
            Some(layout) => {
                let distinct: BTreeSet<usize> = layout.iter().copied().collect();
                prop_assert_eq!(distinct.len(), bundles.len(), "nodes repeat: {:?}", layout);
            }
            None => prop_assert!(!distinct_layout_exists(&nodes, &bundles), "a distinct layout exists"),
        }
    }

    #[test]
    fn pack_uses_one_node_whenever_one_node_can_take_the_group(
        mut nodes in prop::collection::vec(node(), 1..8),
        bundles in prop::collection::vec(bundle(), 1..12),
        big_at in any::<prop::sample::Index>(),
    ) {
        let total = sum(&bundles);
        nodes.insert(big_at.index(nodes.len() + 1), total);
        let layout = place(&nodes, &group(bundles, PlacementStrategy::Pack)).expect("fits on one node");
        prop_assert!(layout.iter().all(|&n| n == layout[0]), "{:?}", layout);
    }

    #[test]
    fn a_small_group_is_feasible_exactly_when_it_can_be_placed_on_an_empty_cluster(
        nodes in prop::collection::vec(node(), 1..8),
        bundles in prop::collection::vec(bundle(), 1..=EXACT_SEARCH_BUNDLES),
        strategy in strategy(),
    ) {
        let factory = group(bundles, strategy);
        let feasible = check_feasible(&nodes, &factory);
        prop_assert_eq!(feasible.is_ok(), place(&nodes, &factory).is_some(), "{:?}", feasible);
    }

    #[test]
    fn a_group_that_can_be_placed_on_an_empty_cluster_is_feasible(
        nodes in prop::collection::vec(node(), 1..24),
        bundles in prop::collection::vec(bundle(), 1..40),
        strategy in strategy(),
    ) {
        let factory = group(bundles, strategy);
        if place(&nodes, &factory).is_some() {
            prop_assert_eq!(check_feasible(&nodes, &factory), Ok(()));
        }
    }

    #[test]
    fn check_feasible_and_place_agree_with_a_brute_force_search_on_small_groups(
        nodes in prop::collection::vec(tight_node(), 1..=4),
        bundles in prop::collection::vec(tight_bundle(), 1..=7),
        strategy in strategy(),
    ) {
        let factory = group(bundles.clone(), strategy);
        let possible = oracle(&nodes, &bundles, strategy);
        let feasible = check_feasible(&nodes, &factory);
        prop_assert_eq!(feasible.is_ok(), possible, "check_feasible says {:?}", feasible);
        match place(&nodes, &factory) {
            Some(layout) => {
                prop_assert!(possible, "placed although no layout exists: {:?}", layout);
                prop_assert!(within_capacity(&nodes, &bundles, &layout), "over-committed: {:?}", layout);
            }
            None => prop_assert!(!possible, "a layout exists but place found none"),
        }
    }

    #[test]
    fn a_strict_group_infeasible_on_the_totals_never_fits_on_less(
        nodes in prop::collection::vec(node(), 1..8),
        bundles in prop::collection::vec(bundle(), 1..12),
        strict in prop::sample::select(vec![PlacementStrategy::StrictPack, PlacementStrategy::StrictSpread]),
    ) {
        let factory = group(bundles, strict);
        let halved: Vec<Resources> = nodes
            .iter()
            .map(|n| n.iter().map(|(k, v)| (k, ResourceAmount::from_steps(v.steps() / 2))).collect())
            .collect();
        if check_feasible(&nodes, &factory).is_err() {
            prop_assert!(place(&halved, &factory).is_none());
        }
    }
}

fn four_by_four() -> Vec<Resources> {
    vec![res("CPU=4"); 4]
}

fn nodes_used(layout: &[usize]) -> usize {
    layout.iter().collect::<BTreeSet<_>>().len()
}

#[test]
fn pack_on_four_nodes_of_four_cpus_uses_the_fewest_nodes() {
    for n in [3usize, 4, 5] {
        let layout = place(
            &four_by_four(),
            &group(vec![res("CPU=1"); n], PlacementStrategy::Pack),
        )
        .expect("fits");
        assert_eq!(nodes_used(&layout), n.div_ceil(4), "n = {n}: {layout:?}");
    }
}

#[test]
fn spread_on_four_nodes_of_four_cpus_uses_the_most_nodes() {
    for n in [3usize, 4, 5] {
        let layout = place(
            &four_by_four(),
            &group(vec![res("CPU=1"); n], PlacementStrategy::Spread),
        )
        .expect("fits");
        assert_eq!(nodes_used(&layout), n.min(4), "n = {n}: {layout:?}");
    }
}

/// The devices each worker's node shares, as Ray's `test_cuda_visible_devices_fractional`
/// computes them: per node, the union of the ids of the workers there.
fn shared_devices(n: usize) -> Vec<Vec<String>> {
    let nodes = vec![res("CPU=8,GPU=2"); 2];
    let bundle = res("GPU=0.5");
    let layout = place(
        &nodes,
        &group(vec![bundle.clone(); n], PlacementStrategy::Pack),
    )
    .expect("fits");
    let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
    let mut pools = vec![AcceleratorPool::new(&ids); 2];
    let mut per_node: Vec<BTreeSet<String>> = vec![BTreeSet::new(); 2];
    for &node in &layout {
        let got = pools[node].take(&bundle).expect("a device with room");
        per_node[node].extend(got["GPU"].iter().cloned());
    }
    let mut out: Vec<Vec<String>> = layout
        .iter()
        .map(|&node| per_node[node].iter().cloned().collect())
        .collect();
    out.sort();
    out
}

#[test]
fn half_gpu_bundles_share_the_lowest_device_as_in_rays_visible_devices_table() {
    let ids = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let table: [(usize, Vec<Vec<String>>); 6] = [
        (1, vec![ids(&["0"])]),
        (2, vec![ids(&["0"]); 2]),
        (3, vec![ids(&["0", "1"]); 3]),
        (4, vec![ids(&["0", "1"]); 4]),
        (5, [vec![ids(&["0"])], vec![ids(&["0", "1"]); 4]].concat()),
        (
            6,
            [vec![ids(&["0"]); 2], vec![ids(&["0", "1"]); 4]].concat(),
        ),
    ];
    for (n, expected) in table {
        assert_eq!(shared_devices(n), expected, "n = {n}");
    }
    assert_eq!(shared_devices(8), vec![ids(&["0", "1"]); 8]);
}

#[test]
fn two_half_gpu_bundles_get_device_zero() {
    let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
    let mut pool = AcceleratorPool::new(&ids);
    let half = res("GPU=0.5");
    assert_eq!(pool.take(&half).expect("room")["GPU"], ["0"]);
    assert_eq!(pool.take(&half).expect("room")["GPU"], ["0"]);
    assert_eq!(pool.take(&res("GPU=1")).expect("room")["GPU"], ["1"]);
    assert_eq!(pool.take(&half), None);
}

#[test]
fn an_infeasible_bundle_names_the_bundle_the_resource_the_ask_and_the_best_node() {
    let nodes = vec![
        res("CPU=8,memory=8000000000"),
        res("CPU=8,memory=4000000000"),
    ];
    let bundles = vec![res("CPU=1"), res("CPU=1"), res("CPU=1,memory=10000000000")];
    let err = check_feasible(&nodes, &group(bundles, PlacementStrategy::Spread)).unwrap_err();
    assert_eq!(
        err,
        PlacementError::BundleTooLarge {
            bundle: 2,
            resource: "memory".into(),
            needed: ResourceAmount::from_units(10_000_000_000),
            best: ResourceAmount::from_units(8_000_000_000),
            strategy: PlacementStrategy::Spread,
        }
    );
    assert_eq!(
        err.to_string(),
        "bundle 2 needs memory=10000000000 but the most memory any node has is 8000000000"
    );
}

#[test]
fn strict_pack_that_no_node_can_hold_says_what_the_bundles_need_together() {
    let nodes = vec![res("CPU=16"); 3];
    let err = check_feasible(
        &nodes,
        &group(vec![res("CPU=4"); 5], PlacementStrategy::StrictPack),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "STRICT_PACK needs all 5 bundles on one node: together they need CPU=20 but the most CPU any node has is 16"
    );
    assert_eq!(err.strategy(), PlacementStrategy::StrictPack);
}

#[test]
fn strict_spread_with_too_few_nodes_says_how_many_can_host_a_bundle() {
    let nodes = [vec![res("CPU=2"); 4], vec![res("CPU=0")]].concat();
    let err = check_feasible(
        &nodes,
        &group(vec![res("CPU=1"); 5], PlacementStrategy::StrictSpread),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "STRICT_SPREAD needs 5 distinct nodes but only 4 nodes can host a bundle"
    );
}

#[test]
fn bundles_that_together_exceed_the_cluster_say_so() {
    let nodes = vec![res("CPU=8,GPU=2"); 2];
    let err = check_feasible(
        &nodes,
        &group(vec![res("GPU=2"); 3], PlacementStrategy::Pack),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the bundles together need GPU=6 but the cluster has GPU=4"
    );
    assert_eq!(err.resource(), Some("GPU"));
}

#[test]
fn a_feasible_group_passes_even_when_the_cluster_is_busy_now() {
    let totals = four_by_four();
    let busy = vec![res("CPU=0"); 4];
    let factory = group(vec![res("CPU=1"); 8], PlacementStrategy::StrictSpread);
    assert!(check_feasible(&totals, &factory).is_err());
    let factory = group(vec![res("CPU=1"); 8], PlacementStrategy::Spread);
    assert_eq!(check_feasible(&totals, &factory), Ok(()));
    assert_eq!(place(&busy, &factory), None);
}
