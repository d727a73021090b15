//! Placement semantics: properties over random clusters and groups, Ray's placement tests
//! (reference §7.2), device id sharing and the explanations of infeasible groups.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ActorOptions, ResourceAmount, Resources};
use trainyard_runtime::placement::{
    AcceleratorPool, EXACT_SEARCH_BUNDLES, PlacementError, check_feasible, place,
};
use trainyard_runtime::reservations::{NodeSpec, Reservations};
use trainyard_runtime::{ActorId, ActorSpec};

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

/// One step of a whole device.
const DEVICE: u128 = 10_000;

/// Whether some assignment of bundles to nodes *and devices* exists by the strategy's rule:
/// every resource but GPU adds up; a node has `floor(GPU)` devices of 1; a GPU amount below 1
/// fits in what one device has left, one of 1 or more is whole and takes that many free
/// devices. Brute force over every node and every device, for small inputs.
fn device_oracle(nodes: &[Resources], bundles: &[Resources], strategy: PlacementStrategy) -> bool {
    struct State {
        left: Vec<Resources>,
        devices: Vec<Vec<u128>>,
        used: Vec<usize>,
    }
    fn go(s: &mut State, bundles: &[Resources], strategy: PlacementStrategy) -> bool {
        let Some((first, rest)) = bundles.split_first() else {
            return true;
        };
        let gpu = first.amount("GPU").steps();
        let plain = first.clone().with("GPU", ResourceAmount::ZERO);
        for n in 0..s.left.len() {
            let allowed = match strategy {
                PlacementStrategy::StrictPack => s.used.iter().all(|&u| u == n),
                PlacementStrategy::StrictSpread => !s.used.contains(&n),
                PlacementStrategy::Pack | PlacementStrategy::Spread => true,
            };
            if !allowed || !s.left[n].covers(&plain) {
                continue;
            }
            // Every way the node's devices can serve `gpu`.
            let options: Vec<Vec<usize>> = if gpu == 0 {
                vec![Vec::new()]
            } else if gpu < DEVICE {
                (0..s.devices[n].len())
                    .filter(|&d| s.devices[n][d] >= gpu)
                    .map(|d| vec![d])
                    .collect()
            } else if gpu % DEVICE == 0 {
                let free: Vec<usize> = (0..s.devices[n].len())
                    .filter(|&d| s.devices[n][d] == DEVICE)
                    .collect();
                let k = usize::try_from(gpu / DEVICE).expect("small");
                if free.len() >= k {
                    vec![free[..k].to_vec()]
                } else {
                    Vec::new()
                }
            } else {
                Vec::new()
            };
            for chosen in options {
                let share = gpu.min(DEVICE);
                s.left[n].try_take(&plain).expect("covered");
                for &d in &chosen {
                    s.devices[n][d] -= share;
                }
                s.used.push(n);
                let found = go(s, rest, strategy);
                s.used.pop();
                for &d in &chosen {
                    s.devices[n][d] += share;
                }
                s.left[n].checked_add_assign(&plain).expect("small sums");
                if found {
                    return true;
                }
            }
        }
        false
    }
    let mut state = State {
        left: nodes
            .iter()
            .map(|n| n.clone().with("GPU", ResourceAmount::ZERO))
            .collect(),
        devices: nodes
            .iter()
            .map(|n| vec![DEVICE; usize::try_from(n.amount("GPU").whole_units()).expect("small")])
            .collect(),
        used: Vec::new(),
    };
    go(&mut state, bundles, strategy)
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
        match place(&nodes, &factory) {
            Some(layout) => {
                prop_assert!(layout.iter().all(|&n| n == layout[0]), "split over nodes: {:?}", layout);
            }
            None => prop_assert!(
                !device_oracle(&nodes, &bundles, PlacementStrategy::StrictPack),
                "a node could take them all"
            ),
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
            None => prop_assert!(
                !device_oracle(&nodes, &bundles, PlacementStrategy::StrictSpread),
                "a distinct layout exists"
            ),
        }
    }

    #[test]
    fn pack_uses_one_node_whenever_one_node_can_take_the_group(
        mut nodes in prop::collection::vec(node(), 1..8),
        bundles in prop::collection::vec(bundle(), 1..12),
        big_at in any::<prop::sample::Index>(),
    ) {
        // One whole device per bundle and whole GPU, so that the devices never stand in the way.
        let mut big = sum(&bundles);
        let devices: u128 = bundles.iter().map(|b| b.amount("GPU").steps().div_ceil(10_000)).sum();
        big.insert("GPU", ResourceAmount::from_steps(devices * 10_000));
        nodes.insert(big_at.index(nodes.len() + 1), big);
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
        "bundle 2 needs memory=10GB but the most memory any node has is 8GB"
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

/// A node of the device tests: a little CPU and 0 to 3 GPUs.
fn device_node() -> impl Strategy<Value = Resources> {
    (1u64..=3, 0u64..=3).prop_map(|(cpu, gpu)| Resources::new().with("CPU", cpu).with("GPU", gpu))
}

/// A bundle of the device tests: GPU from {0, 0.25, 0.4, 0.5, 0.6, 1, 2} and a little CPU.
fn device_bundle() -> impl Strategy<Value = Resources> {
    let gpu = prop::sample::select(vec![0u128, 2_500, 4_000, 5_000, 6_000, 10_000, 20_000]);
    (0u64..=1, gpu).prop_map(|(cpu, gpu)| {
        Resources::new()
            .with("CPU", cpu)
            .with("GPU", ResourceAmount::from_steps(gpu))
    })
}

/// A book of nodes `node-0`, `node-1`, ... with GPU ids `"0"` to `"n-1"`.
fn book(nodes: &[Resources]) -> Reservations {
    Reservations::new(nodes.iter().enumerate().map(|(i, r)| {
        let mut spec = NodeSpec::new(&format!("node-{i}"), r.clone());
        let count = r.amount("GPU").whole_units();
        spec.devices
            .insert("GPU".into(), (0..count).map(|d| d.to_string()).collect());
        spec
    }))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn feasibility_and_reservation_agree_with_a_device_level_brute_force_search(
        nodes in prop::collection::vec(device_node(), 1..=3),
        bundles in prop::collection::vec(device_bundle(), 1..=4),
        strategy in strategy(),
    ) {
        let factory = group(bundles.clone(), strategy);
        let possible = device_oracle(&nodes, &bundles, strategy);
        let feasible = check_feasible(&nodes, &factory);
        prop_assert_eq!(feasible.is_ok(), possible, "check_feasible says {:?}", feasible);
        prop_assert_eq!(place(&nodes, &factory).is_some(), possible);

        let mut book = book(&nodes);
        let Ok(pg) = book.create_group(&factory) else {
            prop_assert!(!possible, "refused although a layout exists");
            return Ok(());
        };
        let reserved = book.placement_info(pg).expect("known group").is_some();
        prop_assert_eq!(reserved, possible, "reserved on an empty cluster: {}", reserved);
        for (index, bundle) in bundles.iter().enumerate() {
            let spec = ActorSpec {
                name: format!("w{index}"),
                options: ActorOptions::try_from(bundle).expect("valid options"),
                placement: Some((pg, index)),
                env: BTreeMap::new(),
            };
            let held = book.hold(ActorId(index as u64), &spec);
            prop_assert!(held.is_ok(), "actor {} cannot take its bundle: {:?}", index, held);
        }
    }
}

#[test]
fn three_bundles_of_six_tenths_of_a_gpu_on_two_gpus_are_refused_at_once() {
    let nodes = vec![res("CPU=8,GPU=2")];
    let factory = group(vec![res("GPU=0.6"); 3], PlacementStrategy::Pack);
    let err = check_feasible(&nodes, &factory).unwrap_err();
    assert_eq!(
        err,
        PlacementError::DeviceShortfall {
            bundle: 2,
            resource: "GPU".into(),
            needed: "0.6".parse().expect("amount"),
            node: 0,
            devices: 2,
            most_left: "0.4".parse().expect("amount"),
            free: 0,
            placed: 2,
            strategy: PlacementStrategy::Pack,
        }
    );
    assert_eq!(
        err.to_string(),
        "bundle 2 needs GPU=0.6 on one device but no node has a device with 0.6 free; the best, node 0, has 2 devices with at most 0.4 left after bundles 0-1"
    );
    assert!(
        book(&nodes).create_group(&factory).is_err(),
        "refused at once, not left to wait"
    );
}

#[test]
fn two_gpus_need_two_wholly_free_devices() {
    // The amounts add up (3.8 of 4 GPUs), but three 0.6-GPU bundles take three devices.
    let nodes = vec![res("CPU=8,GPU=2"); 2];
    for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
        let factory = group(
            vec![res("GPU=0.6"), res("GPU=0.6"), res("GPU=0.6"), res("GPU=2")],
            strategy,
        );
        let err = check_feasible(&nodes, &factory).unwrap_err().to_string();
        let (asked, offered) = err
            .split_once("the best, node ")
            .expect("names the best node");
        assert_eq!(
            asked, "bundle 3 needs GPU=2 as 2 whole free devices but no node has them; ",
            "{strategy}"
        );
        assert!(
            offered.ends_with(", has 1 of its 2 devices free after bundles 0-2"),
            "{err}"
        );
    }
    // One node of two GPUs: a 2-GPU group waits while half a GPU is held, then takes both.
    let nodes = vec![res("CPU=8,GPU=2")];
    let mut book = book(&nodes);
    let half = book
        .create_group(&group(vec![res("GPU=0.5")], PlacementStrategy::Pack))
        .expect("feasible");
    let two = book
        .create_group(&group(vec![res("GPU=2")], PlacementStrategy::Pack))
        .expect("feasible");
    assert!(
        book.placement_info(two).expect("known").is_none(),
        "one device is shared"
    );
    book.remove_group(half).expect("known");
    assert!(book.placement_info(two).expect("known").is_some());
    let spec = ActorSpec {
        name: "w".into(),
        options: ActorOptions::try_from(&res("GPU=2")).expect("valid options"),
        placement: Some((two, 0)),
        env: BTreeMap::new(),
    };
    let held = book.hold(ActorId(1), &spec).expect("room");
    assert_eq!(held.accelerator_ids["GPU"], ["0", "1"]);
}

#[test]
fn an_amount_above_one_that_is_not_whole_is_refused() {
    let err = check_feasible(
        &[res("GPU=4")],
        &group(
            vec![Resources::new().with("GPU", "1.5".parse::<ResourceAmount>().expect("amount"))],
            PlacementStrategy::Pack,
        ),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "bundle 0 needs GPU=1.5 but an amount of 1 or more takes whole devices, so it must be a whole number"
    );
}
