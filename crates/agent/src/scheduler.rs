//! What a scheduler's step says of the worker it holds (a Slurm job step: the agent's
//! [`AgentConfig::scheduler_stops`]), taken over the driver's plan where the step knows
//! better: the memory limit it runs under, and the GPUs it sees.

use std::collections::BTreeMap;

use trainyard_wire::config::{AgentConfig, MemoryLimit};

/// The variable Slurm sets in a step with GPUs: their ids on the node, as the node numbers
/// them.
const STEP_GPUS: &str = "SLURM_STEP_GPUS";
/// The variable CUDA reads, which Slurm sets in a step with GPUs: the ids as the step sees
/// them (renumbered from 0 under `ConstrainDevices`, where a step sees only its own).
const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// `config` with what its step says: a step that asked for no memory has a limit all the
/// same, the one the scheduler gave it (Slurm: the job's, from DefMemPerCPU), so that its
/// tasks' OOM kills are that limit's; and a step's GPUs are the ids it sees them by, so that
/// `CUDA_VISIBLE_DEVICES` names devices that exist in each worker's step.
pub(crate) fn in_step(mut config: AgentConfig, env: &BTreeMap<String, String>) -> AgentConfig {
    if !config.scheduler_stops {
        return config;
    }
    if config.memory.is_none() {
        config.memory =
            trainyard_sys::cgroup::own_memory_limit().map(|limit| MemoryLimit::Scheduler { limit });
    }
    if let Some(ids) = step_gpu_ids(env) {
        config.accelerator_ids.insert("GPU".to_owned(), ids);
    }
    config
}

/// The GPU ids a step sees its GPUs by, from Slurm's variables in it: `CUDA_VISIBLE_DEVICES`
/// as Slurm set it for the step (`0` for a step whose one GPU is the node's 2, under
/// `ConstrainDevices`; `2` without), else `SLURM_STEP_GPUS`; `None` for a step without GPUs
/// of its own (then the plan's ids stand).
fn step_gpu_ids(env: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let ids = |value: &str| -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let step = ids(env.get(STEP_GPUS)?);
    if step.is_empty() {
        return None;
    }
    let visible = env.get(CUDA_VISIBLE_DEVICES).map(|value| ids(value));
    Some(match visible {
        Some(visible) if visible.len() == step.len() => visible,
        _ => step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Slurm's variables in a step, and the GPU ids the step sees by them.
    type Case = (
        &'static [(&'static str, &'static str)],
        Option<&'static [&'static str]>,
    );

    #[test]
    fn a_steps_gpus_are_the_ids_it_sees_them_by() {
        let cases: &[Case] = &[
            // ConstrainDevices: the step sees its one GPU (the node's 2) as 0.
            (
                &[(STEP_GPUS, "2"), (CUDA_VISIBLE_DEVICES, "0")],
                Some(&["0"]),
            ),
            (
                &[(STEP_GPUS, "2,3"), (CUDA_VISIBLE_DEVICES, "0,1")],
                Some(&["0", "1"]),
            ),
            // Without it: the node's own numbers.
            (
                &[(STEP_GPUS, "2"), (CUDA_VISIBLE_DEVICES, "2")],
                Some(&["2"]),
            ),
            // Slurm set no CUDA_VISIBLE_DEVICES, or one that does not match the step's.
            (&[(STEP_GPUS, "1,3")], Some(&["1", "3"])),
            (
                &[(STEP_GPUS, "1,3"), (CUDA_VISIBLE_DEVICES, "0,1,2,3")],
                Some(&["1", "3"]),
            ),
            // A step without GPUs of its own: the plan's ids stand.
            (&[(CUDA_VISIBLE_DEVICES, "0,1")], None),
            (&[(STEP_GPUS, "")], None),
            (&[], None),
        ];
        for (vars, expected) in cases {
            let expected = expected.map(|ids| ids.iter().map(|id| (*id).to_owned()).collect());
            assert_eq!(step_gpu_ids(&env(vars)), expected, "{vars:?}");
        }
    }

    #[test]
    fn only_a_schedulers_step_is_changed() {
        let vars = env(&[(STEP_GPUS, "2"), (CUDA_VISIBLE_DEVICES, "0")]);
        let mut config = trainyard_wire::testing::local_agent_config(
            "127.0.0.1:1".to_owned(),
            trainyard_runtime::ActorId(1),
        );
        config.accelerator_ids = BTreeMap::from([("GPU".to_owned(), vec!["2".to_owned()])]);
        let plain = in_step(config.clone(), &vars);
        assert_eq!(
            plain.accelerator_ids["GPU"],
            ["2"],
            "not a step: the plan's"
        );
        config.scheduler_stops = true;
        let step = in_step(config, &vars);
        assert_eq!(step.accelerator_ids["GPU"], ["0"], "the step's own");
    }
}
