//! Accelerator-id sharing: every worker of a node sees the devices of all the run's workers
//! on that node (`CUDA_VISIBLE_DEVICES=0,1`), so that ranks can address their peers' devices.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

/// Which environment variable carries which accelerator's ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SharingRule {
    /// The accelerator resource (`GPU`, `neuron_cores`, `NPU`).
    pub resource: String,
    /// The variable set on each worker (`CUDA_VISIBLE_DEVICES`).
    pub env_var: String,
    /// Share the node's union of ids (`true`) or give each worker only its own ids (`false`).
    pub share: bool,
}

impl SharingRule {
    /// A rule for `resource` carried in `env_var`.
    #[must_use]
    pub fn new(resource: impl Into<String>, env_var: impl Into<String>, share: bool) -> Self {
        Self {
            resource: resource.into(),
            env_var: env_var.into(),
            share,
        }
    }
}

/// The default rules, as Ray Train's: GPUs in `CUDA_VISIBLE_DEVICES`, shared when the
/// backend asks for it (`share_gpus`); AMD GPUs in `ROCR_VISIBLE_DEVICES`, Neuron cores in
/// `NEURON_RT_VISIBLE_CORES` and Ascend NPUs in `ASCEND_RT_VISIBLE_DEVICES`, shared by default.
#[must_use]
pub fn default_rules(share_gpus: bool) -> Vec<SharingRule> {
    vec![
        SharingRule::new("GPU", "CUDA_VISIBLE_DEVICES", share_gpus),
        SharingRule::new("GPU", "ROCR_VISIBLE_DEVICES", true),
        SharingRule::new("neuron_cores", "NEURON_RT_VISIBLE_CORES", true),
        SharingRule::new("NPU", "ASCEND_RT_VISIBLE_DEVICES", true),
    ]
}

/// The value of a sharing variable for each worker, given each worker's node and ids:
/// the union of the ids of all workers on the same node, deduplicated, sorted as strings
/// and comma-joined (as Ray Train does; `"10"` sorts before `"2"`).
///
/// ```
/// use trainyard_backend_executor::shared_ids;
///
/// let workers = [("a", vec!["1"]), ("a", vec!["0"]), ("b", vec!["0"])];
/// assert_eq!(shared_ids(&workers), ["0,1", "0,1", "0"]);
/// ```
#[must_use]
pub fn shared_ids<N: Eq + Hash, S: AsRef<str>>(workers: &[(N, Vec<S>)]) -> Vec<String> {
    let mut per_node: HashMap<&N, BTreeSet<&str>> = HashMap::new();
    for (node, ids) in workers {
        per_node
            .entry(node)
            .or_default()
            .extend(ids.iter().map(AsRef::as_ref));
    }
    let joined: HashMap<&N, String> = per_node
        .into_iter()
        .map(|(node, ids)| (node, ids.into_iter().collect::<Vec<_>>().join(",")))
        .collect();
    workers
        .iter()
        .map(|(node, _)| joined[node].clone())
        .collect()
}

/// A worker requests an accelerator but its runtime reports no device ids for it; an empty
/// `CUDA_VISIBLE_DEVICES` would silently hide every device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker {worker} requests {resource} but its runtime reports no {resource} ids for it")]
pub struct MissingAcceleratorIds {
    /// The worker's index.
    pub worker: usize,
    /// The accelerator resource.
    pub resource: String,
}

/// Environment for each worker from `rules`: a rule applies to the workers that request its
/// resource; shared rules use [`shared_ids`] over those workers, others the worker's own ids.
///
/// `workers` holds, per worker, its node, whether it requests each resource, and its ids per
/// resource.
///
/// # Errors
/// [`MissingAcceleratorIds`] when a worker requests a rule's resource but holds no ids of it.
pub fn accelerator_env<N: Eq + Hash + Clone>(
    rules: &[SharingRule],
    workers: &[AcceleratorView<N>],
) -> Result<Vec<BTreeMap<String, String>>, MissingAcceleratorIds> {
    let mut env = vec![BTreeMap::new(); workers.len()];
    for rule in rules {
        let using: Vec<usize> = (0..workers.len())
            .filter(|&i| workers[i].requests(&rule.resource))
            .collect();
        if using.is_empty() {
            continue;
        }
        if let Some(&worker) = using
            .iter()
            .find(|&&i| workers[i].ids.get(&rule.resource).is_none_or(Vec::is_empty))
        {
            return Err(MissingAcceleratorIds {
                worker,
                resource: rule.resource.clone(),
            });
        }
        let ids = |i: usize| {
            workers[i]
                .ids
                .get(&rule.resource)
                .cloned()
                .unwrap_or_default()
        };
        let values: Vec<String> = if rule.share {
            let view: Vec<(N, Vec<String>)> = using
                .iter()
                .map(|&i| (workers[i].node.clone(), ids(i)))
                .collect();
            shared_ids(&view)
        } else {
            using.iter().map(|&i| ids(i).join(",")).collect()
        };
        for (i, value) in using.into_iter().zip(values) {
            env[i].insert(rule.env_var.clone(), value);
        }
    }
    Ok(env)
}

/// One worker as accelerator sharing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceleratorView<N> {
    /// The worker's node.
    pub node: N,
    /// Resources the worker requests a positive amount of.
    pub requested: BTreeSet<String>,
    /// Device ids the worker holds, per accelerator resource.
    pub ids: BTreeMap<String, Vec<String>>,
}

impl<N> AcceleratorView<N> {
    fn requests(&self, resource: &str) -> bool {
        self.requested.contains(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: &str, requested: &[&str], gpu: &[&str]) -> AcceleratorView<String> {
        AcceleratorView {
            node: node.to_owned(),
            requested: requested.iter().map(|s| (*s).to_owned()).collect(),
            ids: BTreeMap::from([(
                "GPU".to_owned(),
                gpu.iter().map(|s| (*s).to_owned()).collect(),
            )]),
        }
    }

    #[test]
    fn ids_are_sorted_as_strings() {
        let workers = [("n", vec!["2"]), ("n", vec!["10"]), ("n", vec!["2"])];
        assert_eq!(shared_ids(&workers), ["10,2", "10,2", "10,2"]);
    }

    #[test]
    fn only_workers_that_request_the_resource_get_the_variable() {
        let workers = [
            view("a", &["GPU"], &["1"]),
            view("a", &["CPU"], &[]),
            view("a", &["GPU"], &["0"]),
        ];
        let env = accelerator_env(&default_rules(true), &workers).expect("ids");
        assert_eq!(env[0]["CUDA_VISIBLE_DEVICES"], "0,1");
        assert!(env[1].is_empty());
        assert_eq!(env[2]["ROCR_VISIBLE_DEVICES"], "0,1");
    }

    #[test]
    fn a_gpu_worker_without_gpu_ids_is_an_error_not_an_empty_variable() {
        let workers = [view("a", &["GPU"], &["0"]), view("a", &["GPU"], &[])];
        assert_eq!(
            accelerator_env(&default_rules(true), &workers),
            Err(MissingAcceleratorIds {
                worker: 1,
                resource: "GPU".into()
            })
        );
    }

    #[test]
    fn without_sharing_each_worker_sees_its_own_ids() {
        let workers = [view("a", &["GPU"], &["1"]), view("a", &["GPU"], &["0"])];
        let env = accelerator_env(&default_rules(false), &workers).expect("ids");
        assert_eq!(env[0]["CUDA_VISIBLE_DEVICES"], "1");
        assert_eq!(env[1]["CUDA_VISIBLE_DEVICES"], "0");
    }
}
