//! The node and GPU ordering of workers: Ray Train's upstream tables, and properties.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use trainyard_runtime::NodeId;
use trainyard_worker_group::{WorkerMetadata, node_and_gpu_order};

fn worker(node: &str, gpu_ids: &[&str]) -> WorkerMetadata {
    WorkerMetadata {
        node_id: NodeId::from(node),
        node_ip: format!("10.0.0.{node}"),
        interface: None,
        hostname: format!("host-{node}"),
        pid: 1,
        task_pid: None,
        accelerator_ids: BTreeMap::from([
            (
                "GPU".to_owned(),
                gpu_ids.iter().map(|&id| id.to_owned()).collect(),
            ),
            ("neuron_cores".to_owned(), Vec::new()),
        ]),
    }
}

fn order(workers: &[WorkerMetadata], first_node: Option<&str>) -> Vec<usize> {
    let refs: Vec<&WorkerMetadata> = workers.iter().collect();
    node_and_gpu_order(&refs, first_node.map(NodeId::from).as_ref())
}

/// The node id of each worker after sorting.
fn sorted_nodes(workers: &[WorkerMetadata], first_node: Option<&str>) -> Vec<String> {
    order(workers, first_node)
        .into_iter()
        .map(|i| workers[i].node_id.0.clone())
        .collect()
}

/// Each worker's position among the workers of its node after sorting (its local rank),
/// indexed by the worker's original position.
fn local_ranks(workers: &[WorkerMetadata]) -> Vec<usize> {
    let mut ranks = vec![usize::MAX; workers.len()];
    let mut seen: BTreeMap<&NodeId, usize> = BTreeMap::new();
    for index in order(workers, None) {
        let next = seen.entry(&workers[index].node_id).or_insert(0);
        ranks[index] = *next;
        *next += 1;
    }
    ranks
}

/// `test_group_workers_by_node_id`.
fn upstream_nodes() -> Vec<WorkerMetadata> {
    ["2", "3", "1", "4", "2", "1", "3", "3", "4", "2"]
        .iter()
        .map(|n| worker(n, &[]))
        .collect()
}

#[test]
fn workers_are_grouped_by_node_in_order_of_first_appearance() {
    assert_eq!(
        sorted_nodes(&upstream_nodes(), None),
        ["2", "2", "2", "3", "3", "3", "1", "1", "4", "4"]
    );
}

#[test]
fn the_first_node_group_comes_first() {
    assert_eq!(
        sorted_nodes(&upstream_nodes(), Some("1")),
        ["1", "1", "2", "2", "2", "3", "3", "3", "4", "4"]
    );
}

#[test]
fn a_first_node_without_workers_changes_nothing_else() {
    assert_eq!(
        sorted_nodes(&upstream_nodes(), Some("9")),
        ["2", "2", "2", "3", "3", "3", "1", "1", "4", "4"]
    );
}

#[test]
fn grouping_is_stable_within_a_node() {
    assert_eq!(
        order(&upstream_nodes(), None),
        [0, 4, 9, 1, 6, 7, 2, 5, 3, 8]
    );
}

const NODES: [&str; 8] = ["2", "2", "1", "1", "2", "1", "1", "2"];

#[test]
fn cpu_only_workers_keep_their_order_within_a_node() {
    let workers: Vec<WorkerMetadata> = NODES.iter().map(|n| worker(n, &[])).collect();
    assert_eq!(local_ranks(&workers), [0, 1, 0, 1, 2, 2, 3, 3]);
}

#[test]
fn workers_of_a_node_are_sorted_by_gpu_id() {
    let gpu_ids = ["1", "0", "3", "2", "2", "0", "1", "3"];
    let workers: Vec<WorkerMetadata> = NODES
        .iter()
        .zip(gpu_ids)
        .map(|(n, id)| worker(n, &[id]))
        .collect();
    assert_eq!(local_ranks(&workers), [1, 0, 3, 2, 2, 0, 1, 3]);
}

#[test]
fn ids_that_are_not_numbers_are_compared_as_text() {
    // Upstream splits "1,3" on whitespace, so each worker holds one id such as "1,3".
    let workers = [
        worker("2", &["1,3"]),
        worker("1", &["2,1"]),
        worker("1", &["0,3"]),
        worker("2", &["0,2"]),
    ];
    assert_eq!(local_ranks(&workers), [1, 1, 0, 0]);
}

#[test]
fn the_lowest_of_several_gpu_ids_is_compared_as_a_number() {
    let workers = [
        worker("a", &["10", "3"]),
        worker("a", &["2", "11"]),
        worker("a", &["9"]),
    ];
    // Lowest ids 3, 2 and 9: numerically 2 < 3 < 9 (as text "10" would sort first).
    assert_eq!(order(&workers, None), [1, 0, 2]);
}

#[test]
fn an_empty_group_orders_to_nothing() {
    assert!(order(&[], None).is_empty());
    assert!(order(&[], Some("1")).is_empty());
}

fn workers_strategy() -> impl Strategy<Value = Vec<WorkerMetadata>> {
    let one = (
        0..5u8,
        prop::collection::vec(
            prop_oneof![Just("x"), Just("0"), Just("1"), Just("7"), Just("a")],
            0..3,
        ),
    );
    prop::collection::vec(one, 0..40).prop_map(|workers| {
        workers
            .into_iter()
            .map(|(node, ids)| worker(&node.to_string(), &ids))
            .collect()
    })
}

proptest! {
    #[test]
    fn the_order_is_a_permutation(workers in workers_strategy(), first in prop::option::of(0..6u8)) {
        let first = first.map(|n| n.to_string());
        let mut indexes = order(&workers, first.as_deref());
        indexes.sort_unstable();
        prop_assert_eq!(indexes, (0..workers.len()).collect::<Vec<_>>());
    }

    #[test]
    fn the_workers_of_one_node_are_contiguous(workers in workers_strategy(), first in prop::option::of(0..6u8)) {
        let first = first.map(|n| n.to_string());
        let nodes = sorted_nodes(&workers, first.as_deref());
        let mut finished: HashSet<&str> = HashSet::new();
        for pair in nodes.windows(2) {
            if pair[0] != pair[1] {
                prop_assert!(finished.insert(&pair[0]), "node {} appears twice", pair[0]);
                prop_assert!(!finished.contains(pair[1].as_str()), "node {} appears again", pair[1]);
            }
        }
    }

    #[test]
    fn node_groups_appear_in_order_of_first_appearance(workers in workers_strategy(), first in prop::option::of(0..6u8)) {
        let first = first.map(|n| n.to_string());
        let mut expected: Vec<String> = first.iter().cloned().collect();
        for w in &workers {
            if !expected.contains(&w.node_id.0) {
                expected.push(w.node_id.0.clone());
            }
        }
        // A first node without workers has no group to show.
        expected.retain(|node| workers.iter().any(|w| &w.node_id.0 == node));
        let mut groups: Vec<String> = sorted_nodes(&workers, first.as_deref());
        groups.dedup();
        prop_assert_eq!(groups, expected);
    }

    #[test]
    fn numeric_gpu_ids_never_decrease_within_a_node(
        nodes in prop::collection::vec(0..3u8, 0..30),
        ids in prop::collection::vec(0..16u32, 30),
    ) {
        let workers: Vec<WorkerMetadata> = nodes
            .iter()
            .zip(&ids)
            .map(|(node, id)| worker(&node.to_string(), &[&id.to_string()]))
            .collect();
        let sorted = order(&workers, None);
        for pair in sorted.windows(2) {
            let (a, b) = (&workers[pair[0]], &workers[pair[1]]);
            if a.node_id == b.node_id {
                let id = |w: &WorkerMetadata| w.accelerator_ids["GPU"][0].parse::<u32>().unwrap_or(0);
                prop_assert!(id(a) <= id(b));
            }
        }
    }
}
