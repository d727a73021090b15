//! The preflight: before any task of an attempt starts, every rank's host tries to reach the
//! rendezvous its task will be told ([`Backend::rendezvous`](crate::Backend::rendezvous)),
//! so that a host that cannot fails the attempt within seconds, named with the address, the
//! port and the interface, rather than the rendezvous timing out. A host that does not
//! answer in time fails it too: it and the driver do not reach each other.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use trainyard_runtime::{
    Endpoint, PREFLIGHT_PROBE, Reach, Response, RuntimeError, Unreachable, WorkerInfo,
};

use crate::ranks::rank_of;
use crate::{AttemptFailure, Backend, PreflightTarget};

/// How much longer than its probes a host may take to answer the preflight.
const ANSWER_SLACK: Duration = Duration::from_secs(5);

/// How long the driver waits for a host's answer to a preflight of `targets` endpoints: the
/// probes run at once, each bounded by [`PREFLIGHT_PROBE`].
#[must_use]
pub(crate) fn answer_bound(targets: usize) -> Duration {
    if targets == 0 {
        Duration::ZERO
    } else {
        PREFLIGHT_PROBE + ANSWER_SLACK
    }
}

/// What each rank's host must reach, in world-rank order: the backend's rendezvous for the
/// variables its task will see (the run's own, under the attempt's).
pub(crate) fn targets(
    backend: &dyn Backend,
    run_env: &BTreeMap<String, String>,
    env: &[BTreeMap<String, String>],
) -> Vec<Vec<Endpoint>> {
    env.iter()
        .map(|rank_env| {
            let mut seen = run_env.clone();
            seen.extend(rank_env.iter().map(|(k, v)| (k.clone(), v.clone())));
            backend.rendezvous(&seen)
        })
        .collect()
}

/// A host's answer to the preflight, as the driver got it: `None` when none came in time.
pub(crate) type Answer = Option<Result<Response, RuntimeError>>;

/// A preflight call that failed otherwise than by finding something unreachable.
#[derive(Debug)]
pub(crate) struct Unanswered {
    /// The worker's index.
    pub(crate) worker: usize,
    /// The call's error; `None` when it answered with something else than a preflight's.
    pub(crate) error: Option<Box<RuntimeError>>,
}

/// The first rank (in world-rank order) whose host could not reach its rendezvous, or did
/// not answer within `bound`; the first call that failed otherwise.
pub(crate) fn first_unreached(
    workers: &[&WorkerInfo],
    answers: Vec<Answer>,
    driver: Option<Endpoint>,
    bound: Duration,
) -> Result<Option<AttemptFailure>, Unanswered> {
    for (i, (worker, answer)) in workers.iter().zip(answers).enumerate() {
        let failure = |target, reach| AttemptFailure::Unreachable {
            rank: rank_of(i),
            host: worker.hostname.clone(),
            node: format!("node {} at {}", worker.node_id, worker.node_ip),
            target,
            reach: Box::new(reach),
        };
        match answer {
            Some(Ok(Response::Preflight { reaches })) => {
                if let Some(reach) = reaches.into_iter().find(|r| r.unreachable.is_some()) {
                    return Ok(Some(failure(PreflightTarget::Rendezvous, reach)));
                }
            }
            Some(Ok(_)) => {
                return Err(Unanswered {
                    worker: i,
                    error: None,
                });
            }
            Some(Err(error)) => {
                return Err(Unanswered {
                    worker: i,
                    error: Some(Box::new(error)),
                });
            }
            None => {
                let endpoint = driver.clone().unwrap_or_else(|| Endpoint::new("?", 0));
                let reach = Reach {
                    address: Some(endpoint.host.clone()),
                    endpoint,
                    interface: worker.interface.clone(),
                    unreachable: Some(Unreachable::NoAnswer {
                        within_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                    }),
                };
                return Ok(Some(failure(PreflightTarget::Driver, reach)));
            }
        }
    }
    Ok(None)
}

/// A host's answer to a preflight `call` (`None`: it has nothing to reach), waiting at most
/// `bound` for it.
pub(crate) async fn answer(
    call: Option<BoxFuture<'static, Result<Response, RuntimeError>>>,
    bound: Duration,
) -> Answer {
    match call {
        Some(call) => tokio::time::timeout(bound, call).await.ok(),
        None => Some(Ok(Response::Preflight {
            reaches: Vec::new(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorldRank;
    use trainyard_runtime::NodeId;

    fn worker(node: &str, ip: &str) -> WorkerInfo {
        WorkerInfo {
            node_id: NodeId::from(node),
            node_ip: ip.to_owned(),
            interface: Some("ty0".to_owned()),
            hostname: "vm".to_owned(),
            pid: 1,
            task_pid: None,
            accelerator_ids: BTreeMap::new(),
        }
    }

    fn reach(host: &str, unreachable: Option<Unreachable>) -> Reach {
        Reach {
            endpoint: Endpoint::new(host, 29500),
            address: Some(host.to_owned()),
            interface: Some("ty0".to_owned()),
            unreachable,
        }
    }

    #[test]
    fn the_first_rank_that_cannot_reach_the_rendezvous_is_named_with_address_port_and_interface() {
        let (a, b) = (worker("n1", "10.213.0.11"), worker("n2", "10.213.0.12"));
        let answers = vec![
            Some(Ok(Response::Preflight {
                reaches: vec![reach("10.213.0.250", None)],
            })),
            Some(Ok(Response::Preflight {
                reaches: vec![reach(
                    "10.213.0.250",
                    Some(Unreachable::NoAnswer { within_ms: 3000 }),
                )],
            })),
        ];
        let failure = first_unreached(&[&a, &b], answers, None, Duration::from_secs(8))
            .expect("answers")
            .expect("a failure");
        assert_eq!(failure.rank(), Some(WorldRank(1)));
        assert_eq!(
            failure.to_string(),
            "rank 1's host vm (node n2 at 10.213.0.12) cannot reach the rendezvous 10.213.0.250:29500 (through interface ty0): no answer within 3 s"
        );
    }

    #[test]
    fn a_host_that_does_not_answer_in_time_and_the_driver_do_not_reach_each_other() {
        let a = worker("n1", "10.213.0.11");
        let driver = Endpoint::new("10.213.0.1", 40_123);
        let failure = first_unreached(&[&a], vec![None], Some(driver), Duration::from_secs(8))
            .expect("answers")
            .expect("a failure");
        assert_eq!(
            failure.to_string(),
            "rank 0's host vm (node n1 at 10.213.0.11, interface ty0) and the driver at 10.213.0.1:40123 do not reach each other: no answer within 8 s to the preflight"
        );
        assert_eq!(
            crate::classify(&failure),
            crate::Disposition::Restart,
            "a network may heal, or the next attempt go elsewhere"
        );
    }

    #[test]
    fn hosts_that_reach_everything_pass_and_nothing_to_reach_waits_for_nothing() {
        let a = worker("n1", "10.213.0.11");
        let fine = vec![Some(Ok(Response::Preflight {
            reaches: vec![reach("10.213.0.11", None)],
        }))];
        assert!(matches!(
            first_unreached(&[&a], fine, None, Duration::from_secs(8)),
            Ok(None)
        ));
        assert_eq!(answer_bound(0), Duration::ZERO);
        assert!(answer_bound(1) > PREFLIGHT_PROBE);
    }
}
