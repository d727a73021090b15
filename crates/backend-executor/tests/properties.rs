//! Properties of rank assignment and accelerator sharing.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trainyard_backend_executor::{assign_ranks, shared_ids};

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
    fn world_ranks_are_a_permutation_of_zero_to_n(nodes in prop::collection::vec(0u8..10, 0..200)) {
        let ranks = assign_ranks(&nodes);
        let world: BTreeSet<u32> = ranks.iter().map(|r| r.world_rank.0).collect();
        prop_assert_eq!(world, (0..u32::try_from(nodes.len()).unwrap()).collect::<BTreeSet<_>>());
        prop_assert!(ranks.iter().all(|r| r.world_size as usize == nodes.len()));
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
    fn every_worker_of_a_node_sees_the_same_ids_including_its_own(
        workers in prop::collection::vec((0u8..4, prop::collection::vec(0u8..8, 0..3)), 1..40)
    ) {
        let input: Vec<(u8, Vec<String>)> =
            workers.iter().map(|(n, ids)| (*n, ids.iter().map(ToString::to_string).collect())).collect();
        let shared = shared_ids(&input);
        for (i, (node, ids)) in input.iter().enumerate() {
            let seen: BTreeSet<&str> = shared[i].split(',').filter(|s| !s.is_empty()).collect();
            for id in ids {
                prop_assert!(seen.contains(id.as_str()));
            }
            for (j, (other, _)) in input.iter().enumerate() {
                if other == node {
                    prop_assert_eq!(&shared[i], &shared[j]);
                }
            }
        }
    }
}
