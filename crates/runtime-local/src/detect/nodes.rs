//! [`plan_nodes`]: the machine, with the user's overrides applied, dealt out to virtual
//! nodes; a pure function over plain data.

use trainyard_resources::{CPU, GPU, MEMORY, ResourceAmount, Resources, STEPS_PER_UNIT};
use trainyard_runtime::NodeId;

use super::{DetectError, Gpu, LocalNode, MAX_GPUS, MAX_NODES, Machine, Overrides};

/// Splits the machine, with the user's overrides applied, into `nodes` virtual nodes.
///
/// Whole CPUs are dealt out as evenly as possible, the first nodes getting the remainder and
/// the first node with the fewest getting any fractional part; when there are fewer whole
/// CPUs than nodes, the total is divided exactly in 0.0001 steps. Custom resources split the
/// same way, memory bytes evenly (remainder bytes to the first nodes), and GPUs as contiguous
/// runs of ids (node 0 gets the first ones). The pieces always add up to the total.
///
/// # Errors
/// [`DetectError::NodeCount`] unless `1 <= nodes <= MAX_NODES`;
/// [`DetectError::GpuCount`] when `--num-gpus` is above [`MAX_GPUS`];
/// [`DetectError::ReservedInResources`] when `--resources` holds `CPU`, `GPU` or `memory`.
pub fn plan_nodes(
    machine: &Machine,
    overrides: &Overrides,
    nodes: u32,
) -> Result<Vec<LocalNode>, DetectError> {
    if nodes == 0 || nodes > MAX_NODES {
        return Err(DetectError::NodeCount { nodes });
    }
    check_custom_resources(&overrides.resources)?;
    let gpu_ids = chosen_gpu_ids(&machine.gpus, overrides.num_gpus)?;
    let cpus = overrides.num_cpus.unwrap_or(machine.cpus);
    let memory = overrides.memory.unwrap_or(machine.memory);

    let count = usize::try_from(nodes).unwrap_or(usize::MAX);
    let mut planned = vec![Resources::new(); count];
    deal(&mut planned, CPU, split_amount(cpus, nodes));
    deal(
        &mut planned,
        MEMORY,
        even_shares(u128::from(memory), nodes).map(units),
    );
    for (name, total) in overrides.resources.iter() {
        deal(&mut planned, name, split_amount(total, nodes));
    }

    let mut rest = gpu_ids.as_slice();
    let gpu_counts = even_shares(gpu_ids.len() as u128, nodes);
    Ok(planned
        .into_iter()
        .zip(gpu_counts)
        .enumerate()
        .map(|(index, (mut resources, gpus))| {
            let gpus = usize::try_from(gpus).unwrap_or(usize::MAX);
            // The counts add up to `gpu_ids.len()`, so the split always fits.
            let (mine, others) = rest.split_at_checked(gpus).unwrap_or((rest, &[]));
            rest = others;
            if !mine.is_empty() {
                resources.insert(GPU, units(mine.len() as u128));
            }
            LocalNode {
                id: NodeId(format!("local-{index}")),
                resources,
                gpu_ids: mine.to_vec(),
            }
        })
        .collect())
}

fn check_custom_resources(resources: &Resources) -> Result<(), DetectError> {
    for name in resources.names() {
        let option = match name {
            CPU => "--num-cpus",
            GPU => "--num-gpus",
            MEMORY => "--memory",
            _ => continue,
        };
        return Err(DetectError::ReservedInResources {
            name: name.to_owned(),
            option,
        });
    }
    Ok(())
}

/// The GPU ids to hand out: all detected ones, or the first `wanted`, padded with the lowest
/// indexes not already used.
fn chosen_gpu_ids(gpus: &[Gpu], wanted: Option<u32>) -> Result<Vec<String>, DetectError> {
    let detected = gpus.iter().map(|gpu| gpu.id.clone());
    let Some(wanted) = wanted else {
        return Ok(detected.collect());
    };
    if wanted > MAX_GPUS {
        return Err(DetectError::GpuCount { gpus: wanted });
    }
    let made_up = (0u32..)
        .map(|index| index.to_string())
        .filter(|id| !gpus.iter().any(|gpu| &gpu.id == id));
    let wanted = usize::try_from(wanted).unwrap_or(usize::MAX);
    Ok(detected.chain(made_up).take(wanted).collect())
}

/// Adds each node's share of `name`, leaving out zero shares.
fn deal(planned: &mut [Resources], name: &str, shares: impl Iterator<Item = ResourceAmount>) {
    for (resources, share) in planned.iter_mut().zip(shares) {
        if !share.is_zero() {
            resources.insert(name, share);
        }
    }
}

/// `n` whole units.
fn units(n: u128) -> ResourceAmount {
    ResourceAmount::from_steps(n.saturating_mul(STEPS_PER_UNIT))
}

/// `total` split into `parts` whole numbers that differ by at most one, larger ones first.
fn even_shares(total: u128, parts: u32) -> impl Iterator<Item = u128> {
    let parts = u128::from(parts.max(1));
    let (base, remainder) = (total / parts, total % parts);
    (0..parts).map(move |i| base + u128::from(i < remainder))
}

/// `total` split into `parts` amounts that add up to `total`: whole units dealt out when
/// there are at least as many as parts (the fractional rest going to the first part with
/// the fewest), exact 0.0001 steps otherwise.
fn split_amount(total: ResourceAmount, parts: u32) -> impl Iterator<Item = ResourceAmount> {
    let whole = total.whole_units();
    let shares: Vec<ResourceAmount> = if whole >= u128::from(parts) {
        let fraction = total.steps() % STEPS_PER_UNIT;
        let first_of_fewest = whole % u128::from(parts.max(1));
        even_shares(whole, parts)
            .zip(0u128..)
            .map(|(n, i)| {
                let extra = if i == first_of_fewest { fraction } else { 0 };
                ResourceAmount::from_steps(n * STEPS_PER_UNIT + extra)
            })
            .collect()
    } else {
        even_shares(total.steps(), parts)
            .map(ResourceAmount::from_steps)
            .collect()
    };
    shares.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::gpus::{resolve_gpus, undescribed_gpu};

    fn amount(text: &str) -> ResourceAmount {
        text.parse().unwrap()
    }

    fn machine(cpus: &str, memory: u64, gpus: &[&str]) -> Machine {
        Machine {
            hostname: "test".into(),
            cpus: amount(cpus),
            memory,
            gpus: gpus
                .iter()
                .map(|id| undescribed_gpu((*id).into()))
                .collect(),
        }
    }

    fn cpus_of(nodes: &[LocalNode]) -> Vec<Option<ResourceAmount>> {
        nodes.iter().map(|n| n.resources.get(CPU)).collect()
    }

    fn gpu_ids_of(nodes: &[LocalNode]) -> Vec<Vec<String>> {
        nodes.iter().map(|n| n.gpu_ids.clone()).collect()
    }

    #[test]
    fn two_cpus_split_into_two_nodes_give_one_each() {
        let nodes = plan_nodes(&machine("2", 0, &[]), &Overrides::default(), 2).unwrap();
        assert_eq!(cpus_of(&nodes), [Some(amount("1")), Some(amount("1"))]);
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["local-0", "local-1"]);
    }

    #[test]
    fn three_cpus_into_two_nodes_give_the_first_node_the_extra_one() {
        let nodes = plan_nodes(&machine("3", 0, &[]), &Overrides::default(), 2).unwrap();
        assert_eq!(cpus_of(&nodes), [Some(amount("2")), Some(amount("1"))]);
    }

    #[test]
    fn one_cpu_into_four_nodes_is_split_exactly_into_quarters() {
        let nodes = plan_nodes(&machine("1", 0, &[]), &Overrides::default(), 4).unwrap();
        assert_eq!(cpus_of(&nodes), vec![Some(amount("0.25")); 4]);
    }

    #[test]
    fn one_and_a_half_cpus_into_two_nodes_give_three_quarters_each() {
        let nodes = plan_nodes(&machine("1.5", 0, &[]), &Overrides::default(), 2).unwrap();
        assert_eq!(
            cpus_of(&nodes),
            [Some(amount("0.75")), Some(amount("0.75"))]
        );
    }

    #[test]
    fn a_fractional_rest_goes_to_the_first_node_with_the_fewest_whole_cpus() {
        let plan = |cpus, nodes| {
            cpus_of(&plan_nodes(&machine(cpus, 0, &[]), &Overrides::default(), nodes).unwrap())
        };
        assert_eq!(plan("2.5", 2), [Some(amount("1.5")), Some(amount("1"))]);
        assert_eq!(plan("3.5", 2), [Some(amount("2")), Some(amount("1.5"))]);
    }

    #[test]
    fn an_inexact_split_adds_up_to_the_total_in_steps() {
        let nodes = plan_nodes(&machine("1", 0, &[]), &Overrides::default(), 3).unwrap();
        assert_eq!(
            cpus_of(&nodes),
            [
                Some(amount("0.3334")),
                Some(amount("0.3333")),
                Some(amount("0.3333"))
            ]
        );
        assert_eq!(
            plan_nodes(&machine("0.0002", 0, &[]), &Overrides::default(), 3)
                .map(|nodes| cpus_of(&nodes))
                .unwrap(),
            [Some(ResourceAmount::STEP), Some(ResourceAmount::STEP), None]
        );
    }

    #[test]
    fn every_split_adds_up_to_the_total_and_is_even_within_one_unit() {
        for steps in (0..60_000u128)
            .step_by(997)
            .chain([1, 9_999, 10_000, 10_001])
        {
            let total = ResourceAmount::from_steps(steps);
            for parts in [1, 2, 3, 4, 7, 16, 1024] {
                let shares: Vec<ResourceAmount> = split_amount(total, parts).collect();
                assert_eq!(shares.len(), parts as usize);
                assert_eq!(shares.iter().copied().sum::<ResourceAmount>(), total);
                let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(
                    max.steps() - min.steps() <= STEPS_PER_UNIT,
                    "{total} / {parts}"
                );
            }
        }
    }

    #[test]
    fn num_gpus_fakes_gpus_on_a_machine_without_any() {
        let overrides = Overrides {
            num_gpus: Some(2),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&machine("1", 0, &[]), &overrides, 1).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["0", "1"]]);
        assert_eq!(nodes[0].resources.get(GPU), Some(amount("2")));
    }

    #[test]
    fn num_gpus_takes_the_first_detected_gpus_and_pads_with_unused_indexes() {
        let with = |num_gpus| Overrides {
            num_gpus: Some(num_gpus),
            ..Overrides::default()
        };
        let gpus = machine("1", 0, &["GPU-a", "GPU-b", "GPU-c"]);
        let nodes = plan_nodes(&gpus, &with(2), 1).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["GPU-a", "GPU-b"]]);

        let nodes = plan_nodes(&machine("1", 0, &["1"]), &with(3), 1).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["1", "0", "2"]]);

        let nodes = plan_nodes(&gpus, &with(0), 1).unwrap();
        assert!(nodes[0].gpu_ids.is_empty());
        assert!(!nodes[0].resources.contains(GPU));
    }

    #[test]
    fn a_cuda_visible_devices_subset_is_dealt_out_in_its_order() {
        let mut m = machine("2", 0, &[]);
        m.gpus = resolve_gpus(Some("1,3"), false, Vec::new);
        let nodes = plan_nodes(&m, &Overrides::default(), 2).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["1"], vec!["3"]]);
        for node in &nodes {
            assert_eq!(node.resources.get(GPU), Some(amount("1")));
        }
    }

    #[test]
    fn gpus_are_dealt_as_contiguous_runs_and_a_node_without_one_lacks_the_key() {
        let m = machine("4", 0, &["0", "1", "2"]);
        let nodes = plan_nodes(&m, &Overrides::default(), 2).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["0", "1"], vec!["2"]]);
        assert_eq!(nodes[0].resources.get(GPU), Some(amount("2")));

        let nodes = plan_nodes(&machine("4", 0, &["0"]), &Overrides::default(), 2).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["0"], vec![]]);
        assert!(!nodes[1].resources.contains(GPU));
    }

    #[test]
    fn memory_bytes_are_split_evenly_with_the_remainder_to_the_first_nodes() {
        let nodes = plan_nodes(&machine("3", 11, &[]), &Overrides::default(), 3).unwrap();
        let memory: Vec<_> = nodes.iter().map(|n| n.resources.get(MEMORY)).collect();
        assert_eq!(
            memory,
            [Some(amount("4")), Some(amount("4")), Some(amount("3"))]
        );

        let nodes = plan_nodes(&machine("3", 2, &[]), &Overrides::default(), 3).unwrap();
        assert!(!nodes[2].resources.contains(MEMORY));
    }

    #[test]
    fn overrides_replace_what_was_detected() {
        let overrides = Overrides {
            num_cpus: Some(amount("8")),
            memory: Some(1000),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&machine("2", 5, &[]), &overrides, 1).unwrap();
        let expected = Resources::new()
            .with(CPU, amount("8"))
            .with(MEMORY, amount("1000"));
        assert_eq!(nodes[0].resources, expected);
    }

    #[test]
    fn custom_resources_split_like_cpus_and_zero_shares_are_absent() {
        let overrides = Overrides {
            resources: "custom=3,tiny=1,none=0".parse().unwrap(),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&machine("0", 0, &[]), &overrides, 2).unwrap();
        assert_eq!(
            nodes[0].resources,
            Resources::new()
                .with("custom", amount("2"))
                .with("tiny", amount("0.5"))
        );
        assert_eq!(
            nodes[1].resources,
            Resources::new()
                .with("custom", amount("1"))
                .with("tiny", amount("0.5"))
        );
    }

    #[test]
    fn node_counts_outside_one_to_1024_are_refused_naming_the_option() {
        let m = machine("1", 0, &[]);
        let err = plan_nodes(&m, &Overrides::default(), 0).unwrap_err();
        assert_eq!(err, DetectError::NodeCount { nodes: 0 });
        assert_eq!(err.to_string(), "--nodes must be between 1 and 1024, got 0");
        assert!(plan_nodes(&m, &Overrides::default(), 1025).is_err());
        assert_eq!(
            plan_nodes(&m, &Overrides::default(), 1024).unwrap().len(),
            1024
        );
    }

    #[test]
    fn too_many_gpus_are_refused() {
        let overrides = Overrides {
            num_gpus: Some(u32::MAX),
            ..Overrides::default()
        };
        let err = plan_nodes(&machine("1", 0, &[]), &overrides, 1).unwrap_err();
        assert_eq!(err, DetectError::GpuCount { gpus: u32::MAX });
    }

    #[test]
    fn reserved_names_in_resources_point_to_their_own_option() {
        for (text, name, option) in [
            ("CPU=1", CPU, "--num-cpus"),
            ("a=1,GPU=1", GPU, "--num-gpus"),
            ("memory=10GB", MEMORY, "--memory"),
        ] {
            let overrides = Overrides {
                resources: text.parse().unwrap(),
                ..Overrides::default()
            };
            let err = plan_nodes(&machine("1", 0, &[]), &overrides, 1).unwrap_err();
            assert_eq!(
                err,
                DetectError::ReservedInResources {
                    name: name.into(),
                    option
                }
            );
            assert_eq!(
                err.to_string(),
                format!("resource `{name}` cannot be set with --resources, use {option} instead")
            );
        }
    }
}
