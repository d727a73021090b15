//! Properties of rank assignment and accelerator sharing.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trainyard_backend_executor::{assign_ranks, shared_ids};
use trainyard_runtime::{NodeId, WorkerInfo};
use trainyard_worker_group::node_and_gpu_order;

/// Workers already grouped by node, as the worker group's sort leaves them.
fn grouped_nodes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((0u8..20, 1usize..6), 1..30).prop_map(|groups| {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (node, count) in groups {
            if seen.insert(node) {
                out.extend(std::iter::repeat_n(node, count));
            }
        }
        out
    })
}

proptest! {
    #[test]
    fn sorted_then_ranked_workers_are_grouped_by_node_with_dense_ranks(
        workers in prop::collection::vec((0u8..6, prop::option::of(0u8..8)), 1..60)
    ) {
        // Worker metadata in spawn order, as a runtime reports it.
        let metadata: Vec<WorkerInfo> = workers
            .iter()
            .enumerate()
            .map(|(i, (node, gpu))| WorkerInfo {
                node_id: NodeId(format!("node-{node}")),
                node_ip: "10.0.0.1".to_owned(),
                interface: None,
                hostname: format!("host-{node}"),
                pid: u32::try_from(i).unwrap(),
                task_pid: None,
                accelerator_ids: gpu
                    .map(|g| BTreeMap::from([("GPU".to_owned(), vec![g.to_string()])]))
                    .unwrap_or_default(),
            })
            .collect();
        let refs: Vec<&WorkerInfo> = metadata.iter().collect();
        let order = node_and_gpu_order(&refs, None);
        let nodes: Vec<&NodeId> = order.iter().map(|&i| &metadata[i].node_id).collect();
        let ranks = assign_ranks(&nodes);
        // Every worker gets exactly one world rank.
        let mut seen: Vec<usize> = order.clone();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..metadata.len()).collect::<Vec<_>>());
        // Workers of one node hold contiguous world ranks with local ranks 0..k.
        for (rank, node) in ranks.iter().zip(&nodes) {
            let same: Vec<u32> = ranks
                .iter()
                .zip(&nodes)
                .filter(|(_, n)| *n == node)
                .map(|(r, _)| r.world_rank.0)
                .collect();
            let first = same[0];
            prop_assert!(same.windows(2).all(|w| w[1] == w[0] + 1));
            prop_assert_eq!(rank.local_rank, rank.world_rank.0 - first);
            prop_assert_eq!(rank.local_world_size as usize, same.len());
        }
        // Node ranks are dense, in order of first appearance.
        let max_node = ranks.iter().map(|r| r.node_rank).max().unwrap();
        let distinct: BTreeSet<&NodeId> = nodes.iter().copied().collect();
        prop_assert_eq!(max_node as usize + 1, distinct.len());
    }

    #[test]
    fn local_ranks_are_contiguous_per_node(nodes in prop::collection::vec(0u8..10, 1..200)) {
        let ranks = assign_ranks(&nodes);
        let mut per_node: BTreeMap<u8, Vec<u32>> = BTreeMap::new();
        for (node, rank) in nodes.iter().zip(&ranks) {
            per_node.entry(*node).or_default().push(rank.local_rank);
        }
        for (node, locals) in per_node {
            let expected: Vec<u32> = (0..u32::try_from(locals.len()).unwrap()).collect();
            prop_assert_eq!(&locals, &expected, "node {}", node);
            for (n, rank) in nodes.iter().zip(&ranks) {
                if *n == node {
                    prop_assert_eq!(rank.local_world_size as usize, locals.len());
                }
            }
        }
    }

    #[test]
    fn node_ranks_are_dense_in_first_appearance_order(nodes in prop::collection::vec(0u8..10, 1..200)) {
        let ranks = assign_ranks(&nodes);
        let mut order: Vec<u8> = Vec::new();
        for node in &nodes {
            if !order.contains(node) {
                order.push(*node);
            }
        }
        for (node, rank) in nodes.iter().zip(&ranks) {
            let expected = order.iter().position(|n| n == node).unwrap();
            prop_assert_eq!(rank.node_rank as usize, expected);
        }
    }

    #[test]
    fn grouped_workers_get_contiguous_world_ranks_per_node(nodes in grouped_nodes()) {
        let ranks = assign_ranks(&nodes);
        for pair in ranks.windows(2).zip(nodes.windows(2)) {
            let (r, n) = pair;
            if n[0] == n[1] {
                prop_assert_eq!(r[1].local_rank, r[0].local_rank + 1);
                prop_assert_eq!(r[1].node_rank, r[0].node_rank);
            } else {
                prop_assert_eq!(r[1].local_rank, 0);
                prop_assert_eq!(r[1].node_rank, r[0].node_rank + 1);
            }
        }
    }

    #[test]
    fn every_worker_sees_exactly_its_nodes_ids_deduplicated_and_string_sorted(
        workers in prop::collection::vec((0u8..4, prop::collection::vec(0u8..12, 0..3)), 1..40)
    ) {
        let input: Vec<(u8, Vec<String>)> =
            workers.iter().map(|(n, ids)| (*n, ids.iter().map(ToString::to_string).collect())).collect();
        let shared = shared_ids(&input);
        for (i, (node, _)) in input.iter().enumerate() {
            let union: BTreeSet<&str> = input
                .iter()
                .filter(|(n, _)| n == node)
                .flat_map(|(_, ids)| ids.iter().map(String::as_str))
                .collect();
            let expected = union.into_iter().collect::<Vec<_>>().join(",");
            prop_assert_eq!(&shared[i], &expected);
        }
    }
}
