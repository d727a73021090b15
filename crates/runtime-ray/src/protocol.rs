//! The bridge's wire messages: one JSON object per line, each a serde type.
//!
//! Requests go to the bridge's stdin as `{"id": N, "op": "...", "deadline_ms": D, ...}`, where
//! `D` is when the caller stops waiting (Unix time in milliseconds): the bridge refuses work it
//! would start later, and kills an actor whose start completes later. Replies come back on its
//! protocol stream as `{"id": N, "ok": {...}}` or `{"id": N, "error": {"kind", "message"}}`
//! (`"id": null` for a request line without a readable id); events (`ready`, `failed`,
//! `actor_ended`) carry `"event"` instead of an id.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use trainyard_resources::{ActorOptions, Resources};

/// A placement group's id in Ray, as Ray's hex string. The Ray runtime maps each
/// [`trainyard_runtime::PlacementGroupId`] it hands out to one of these.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RayPlacementGroupId(pub String);

impl fmt::Display for RayPlacementGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A request line, as written to the bridge's stdin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BridgeRequest<'a> {
    pub(crate) id: u64,
    /// When the caller stops waiting for the reply, in milliseconds after the Unix epoch (the
    /// bridge runs on this machine: both read the same clock).
    pub(crate) deadline_ms: u64,
    #[serde(flatten)]
    pub(crate) op: Op<'a>,
}

/// A secret on the wire: serialised as the string, shown by `Debug` as `<redacted>`.
#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct Secret<'a>(pub(crate) &'a str);

impl fmt::Debug for Secret<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The operations the bridge understands, tagged by `op`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op<'a> {
    Nodes,
    CreatePg {
        name: &'a str,
        bundles: &'a [Resources],
        strategy: &'a str,
        /// Ray node ids (hex) no bundle may go to.
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        avoid: &'a [String],
    },
    PgState {
        pg: &'a RayPlacementGroupId,
    },
    WaitPg {
        pg: &'a RayPlacementGroupId,
        timeout_s: f64,
    },
    RemovePg {
        pg: &'a RayPlacementGroupId,
    },
    Spawn {
        name: &'a str,
        pg: Option<&'a RayPlacementGroupId>,
        bundle: u32,
        options: &'a ActorOptions,
        program: &'a str,
        args: &'a [String],
        env: &'a BTreeMap<String, String>,
        config: &'a serde_json::Value,
        token: Secret<'a>,
        cwd: Option<&'a str>,
        timeout_s: f64,
    },
    Signal {
        name: &'a str,
        signal: i32,
        task_pgid: Option<i32>,
    },
    Kill {
        name: &'a str,
    },
    Actors,
    Cluster,
    Ping,
    Shutdown,
}

impl Op<'_> {
    /// The op's wire name, for errors and logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Nodes => "nodes",
            Self::CreatePg { .. } => "create_pg",
            Self::PgState { .. } => "pg_state",
            Self::WaitPg { .. } => "wait_pg",
            Self::RemovePg { .. } => "remove_pg",
            Self::Spawn { .. } => "spawn",
            Self::Signal { .. } => "signal",
            Self::Kill { .. } => "kill",
            Self::Actors => "actors",
            Self::Cluster => "cluster",
            Self::Ping => "ping",
            Self::Shutdown => "shutdown",
        }
    }
}

/// One line from the bridge: a reply to a request, or an unsolicited event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub(crate) enum Incoming {
    /// A reply, matched to its request by id.
    Reply(Reply),
    /// An event.
    Event(Event),
}

/// A reply line.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Reply {
    /// The request's id; `None` for a request line whose id could not be read.
    pub(crate) id: Option<u64>,
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
}

/// What a request came to.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// Success, with the op's result object (typed by the caller).
    Ok(serde_json::Value),
    /// Failure, as Ray reported it.
    Error(RayFailure),
}

/// An unsolicited line from the bridge.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Event {
    /// `ray.init` worked.
    Ready(ReadyInfo),
    /// `ray.init` (or `import ray`) failed; the bridge exits.
    Failed(RayFailure),
    /// An actor's agent exited or the actor died.
    ActorEnded(ActorEnded),
}

/// An error as the bridge reports it: a kind to match on and Ray's own text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RayFailure {
    /// `invalid`, `timeout`, `deadline` (the request's deadline passed before its work could
    /// be done), `closing`, `name_taken`, `actor_died`, `unknown_group`, `unknown_actor`,
    /// `protocol`, `ray` for requests; `auth`, `unreachable`, `start` for start-up.
    pub kind: String,
    /// Ray's message, with its chain of causes.
    pub message: String,
}

/// What the bridge reports once it is connected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyInfo {
    /// `ray.__version__`.
    pub ray_version: String,
    /// The IP of the node the bridge attached to.
    pub node_ip: String,
    /// The GCS address (`host:port`).
    pub address: String,
    /// Whether the bridge started a throwaway local head (no address given).
    pub started_head: bool,
    /// Seconds `ray.init` took inside the bridge.
    #[serde(default)]
    pub init_s: f64,
}

/// One Ray node as the bridge reports it, with resources in Ray's units (`memory` in bytes);
/// `node:*` and placement-group (`*_group_*`) entries are left out. The Ray runtime turns the
/// live ones into [`trainyard_runtime::NodeInfo`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RayNodeInfo {
    /// Ray's 56-hex node id.
    pub node_id: String,
    /// The node's IP.
    pub ip: String,
    /// The node's host name.
    pub hostname: String,
    /// False for nodes Ray has marked dead (they stay in the list, with no resources).
    pub alive: bool,
    /// Total resources.
    pub total: BTreeMap<String, f64>,
    /// Resources not reserved right now.
    pub available: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct NodesReply {
    pub(crate) nodes: Vec<RayNodeInfo>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct CreatePgReply {
    pub(crate) pg: RayPlacementGroupId,
}

/// A placement group's `state` in `placement_group_table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GroupState {
    /// Waiting for resources.
    Pending,
    /// Resources prepared, not yet committed.
    Prepared,
    /// Every bundle is placed.
    Created,
    /// Removed.
    Removed,
    /// A node of the group was lost; Ray places the lost bundles again.
    Rescheduling,
    /// A state this bridge does not know.
    #[serde(other)]
    Unknown,
}

/// A placement group's `stats.scheduling_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SchedulingState {
    /// Not tried yet.
    Queued,
    /// Removed.
    Removed,
    /// Being scheduled.
    SchedulingStarted,
    /// Feasible, but the resources are busy (also shown for packings Ray cannot solve).
    NoResources,
    /// A bundle fits no node, or too few nodes for `STRICT_SPREAD`.
    Infeasible,
    /// Committing the reservation failed.
    FailedToCommitResources,
    /// Placed.
    Finished,
    /// A state this bridge does not know (or none reported).
    #[serde(other)]
    Unknown,
}

/// A placement group as Ray's table shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The group's state.
    pub state: GroupState,
    /// Its scheduling state.
    pub scheduling_state: SchedulingState,
    /// The node id of each bundle, `""` while unplaced.
    pub bundle_nodes: Vec<String>,
}

/// The result of waiting for a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupReadiness {
    /// Whether every bundle was placed within the timeout.
    pub ready: bool,
    /// The node id of each bundle, `""` while unplaced.
    pub bundle_nodes: Vec<String>,
}

/// What a started actor reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Started {
    /// The agent's pid (on the actor's node).
    pub pid: u32,
    /// The actor process's pid, which is also the agent's process group.
    pub actor_pid: u32,
    /// The node the actor runs on.
    pub node_id: String,
    /// That node's IP.
    pub node_ip: String,
    /// Accelerator ids Ray gave the actor (`GPU`, `neuron_cores`, `TPU`, `NPU`, `HPU`).
    pub accelerator_ids: BTreeMap<String, Vec<String>>,
    /// `get_assigned_resources()` inside the actor (includes `memory`).
    pub assigned: BTreeMap<String, f64>,
}

/// Why an actor ended without its agent's exit status.
///
/// The bridge takes it from the typed death cause Ray's GCS records for the actor (the
/// `reason` of its `ActorDiedErrorContext`, or an `OomContext`), never from the text of Ray's
/// message, which is only carried along for people to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeathKind {
    /// `ray.kill` (reason `RAY_KILL`).
    Killed,
    /// The actor's node died (reason `NODE_DIED`).
    NodeDied,
    /// The actor's worker process died (reason `WORKER_DIED`).
    WorkerDied,
    /// The actor's owner (the bridge's job) died (reason `OWNER_DIED`).
    OwnerDied,
    /// Ray's memory monitor killed the actor's worker because its node ran low on memory.
    OutOfMemory,
    /// The actor stayed unreachable past the bridge's grace period (no death cause: the
    /// bridge gave up waiting for one).
    Unavailable,
    /// The bridge process itself was lost (never sent by the bridge).
    BridgeLost,
    /// Any other cause, or none recorded, or a kind newer than this client.
    #[serde(other)]
    Other,
}

/// How an actor died.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorDeath {
    /// The cause, classified.
    pub kind: DeathKind,
    /// Ray's message.
    pub message: String,
}

/// The end of an actor: the agent's exit status, or the actor's death.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorEnded {
    /// The actor's name.
    pub name: String,
    /// The agent's exit code when it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended the agent.
    pub signal: Option<i32>,
    /// Set when the actor died: alone when the agent's status is unknown, or together with
    /// the agent's status when the agent exited (was signalled) as the actor went down.
    pub died: Option<ActorDeath>,
}

impl ActorEnded {
    /// The end reported for every actor when the bridge process is lost.
    pub(crate) fn bridge_lost(name: String, message: String) -> Self {
        Self {
            name,
            exit_code: None,
            signal: None,
            died: Some(ActorDeath {
                kind: DeathKind::BridgeLost,
                message,
            }),
        }
    }
}

/// An actor as the bridge holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorEntry {
    /// Its name.
    pub name: String,
    /// `starting`, `alive`, `ending` or `ended`.
    pub state: String,
    /// Its placement group.
    pub pg: Option<RayPlacementGroupId>,
}

/// What the bridge holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holdings {
    /// Actors spawned and not forgotten.
    pub actors: Vec<ActorEntry>,
    /// Placement groups created and not removed.
    pub groups: Vec<RayPlacementGroupId>,
}

/// An actor as the GCS sees it (any job's, dead ones included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterActor {
    /// Ray's actor id (hex).
    pub actor_id: String,
    /// Its name, `""` when unnamed.
    pub name: String,
    /// `DEPENDENCIES_UNREADY`, `PENDING_CREATION`, `ALIVE`, `RESTARTING` or `DEAD`.
    pub state: String,
    /// Its process id, once it has one.
    pub pid: Option<u32>,
    /// The job (driver) that owns it.
    pub job_id: String,
}

/// A placement group as the GCS sees it (any job's, removed ones included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterGroup {
    /// Its id.
    pub pg: RayPlacementGroupId,
    /// Its name, `""` when unnamed.
    pub name: String,
    /// Its state.
    pub state: GroupState,
}

/// Every actor and placement group the cluster knows, from the GCS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The actors.
    pub actors: Vec<ClusterActor>,
    /// The groups.
    pub groups: Vec<ClusterGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct SignalReply {
    pub(crate) sent: bool,
}

/// An empty `ok` object.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Empty {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_request_carries_memory_as_an_option_not_a_custom_resource() {
        let dict: Resources = r#"{"CPU": 1, "memory": 10000, "worker_res": 0.5}"#
            .parse()
            .expect("valid resources");
        let options = ActorOptions::try_from(&dict).expect("valid options");
        let pg = RayPlacementGroupId("ab12".into());
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        let config = serde_json::json!({"driver": "127.0.0.1:1"});
        let request = BridgeRequest {
            id: 7,
            deadline_ms: 1_700_000_000_000,
            op: Op::Spawn {
                name: "run-w0",
                pg: Some(&pg),
                bundle: 1,
                options: &options,
                program: "/bin/agent",
                args: &[],
                env: &env,
                config: &config,
                token: Secret("t"),
                cwd: Some("/work"),
                timeout_s: 5.0,
            },
        };
        let json = serde_json::to_value(&request).expect("serialises");
        assert_eq!(json["id"], 7);
        assert_eq!(json["deadline_ms"], 1_700_000_000_000u64);
        assert_eq!(json["op"], "spawn");
        assert_eq!(json["token"], "t");
        assert_eq!(json["pg"], "ab12");
        assert_eq!(json["bundle"], 1);
        assert_eq!(json["options"]["memory"], 10000);
        assert_eq!(json["options"]["num_cpus"], 1);
        assert_eq!(
            json["options"]["resources"],
            serde_json::json!({"worker_res": 0.5})
        );
        assert_eq!(
            json["options"]["object_store_memory"],
            serde_json::Value::Null
        );
        assert_eq!(json["env"]["A"], "1");
    }

    #[test]
    fn unit_ops_serialise_to_just_their_name() {
        let line = serde_json::to_string(&BridgeRequest {
            id: 1,
            deadline_ms: 2,
            op: Op::Nodes,
        })
        .expect("serialises");
        assert_eq!(line, r#"{"id":1,"deadline_ms":2,"op":"nodes"}"#);
    }

    #[test]
    fn create_pg_sends_bundles_as_numbers() {
        let bundles: Vec<Resources> = vec![
            r#"{"CPU": 1, "memory": 1000000000}"#.parse().expect("valid"),
            r#"{"CPU": 0.5}"#.parse().expect("valid"),
        ];
        let json = serde_json::to_value(BridgeRequest {
            id: 2,
            deadline_ms: 3,
            op: Op::CreatePg {
                name: "g",
                bundles: &bundles,
                strategy: "SPREAD",
                avoid: &[],
            },
        })
        .expect("serialises");
        assert_eq!(
            json["bundles"],
            serde_json::json!([{"CPU": 1, "memory": 1000000000u64}, {"CPU": 0.5}])
        );
        assert_eq!(json["strategy"], "SPREAD");
        assert!(json.get("avoid").is_none(), "{json}");
    }

    #[test]
    fn replies_and_events_are_told_apart() {
        let ok: Incoming = serde_json::from_str(r#"{"id":3,"ok":{"pg":"ff"}}"#).expect("parses");
        assert_eq!(
            ok,
            Incoming::Reply(Reply {
                id: Some(3),
                outcome: Outcome::Ok(serde_json::json!({"pg": "ff"}))
            })
        );
        let err: Incoming =
            serde_json::from_str(r#"{"id":4,"error":{"kind":"invalid","message":"bad"}}"#)
                .expect("parses");
        assert_eq!(
            err,
            Incoming::Reply(Reply {
                id: Some(4),
                outcome: Outcome::Error(RayFailure {
                    kind: "invalid".into(),
                    message: "bad".into()
                })
            })
        );
        let ended: Incoming = serde_json::from_str(
            r#"{"event":"actor_ended","name":"a","exit_code":null,"signal":null,
                "died":{"kind":"killed","message":"killed by ray.kill"}}"#,
        )
        .expect("parses");
        let Incoming::Event(Event::ActorEnded(ended)) = ended else {
            panic!("not an actor_ended event: {ended:?}");
        };
        assert_eq!(ended.died.map(|d| d.kind), Some(DeathKind::Killed));
        let ready: Incoming = serde_json::from_str(
            r#"{"event":"ready","ray_version":"2.60.0","node_ip":"10.0.0.1",
                "address":"10.0.0.1:6379","started_head":false,"init_s":0.1}"#,
        )
        .expect("parses");
        assert!(matches!(
            ready,
            Incoming::Event(Event::Ready(ReadyInfo {
                started_head: false,
                ..
            }))
        ));
    }

    #[test]
    fn the_run_token_never_shows_in_a_requests_debug_output() {
        let options = ActorOptions::default();
        let env = BTreeMap::new();
        let config = serde_json::json!({});
        let token = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let request = BridgeRequest {
            id: 1,
            deadline_ms: 1,
            op: Op::Spawn {
                name: "run-w0",
                pg: None,
                bundle: 0,
                options: &options,
                program: "/bin/agent",
                args: &[],
                env: &env,
                config: &config,
                token: Secret(token),
                cwd: None,
                timeout_s: 1.0,
            },
        };
        let shown = format!("{request:?} {request:#?}");
        assert!(!shown.contains(token), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let line = serde_json::to_string(&request).expect("serialises");
        assert!(line.contains(token), "the wire still carries it: {line}");
    }

    #[test]
    fn a_rejected_request_line_is_a_reply_without_an_id() {
        let rejected: Incoming = serde_json::from_str(
            r#"{"id":null,"error":{"kind":"protocol","message":"not an object"}}"#,
        )
        .expect("parses");
        assert!(
            matches!(rejected, Incoming::Reply(Reply { id: None, outcome: Outcome::Error(ref f) }) if f.kind == "protocol"),
            "{rejected:?}"
        );
    }

    #[test]
    fn an_agent_killed_by_a_signal_and_unknown_states_parse() {
        let ended: ActorEnded =
            serde_json::from_str(r#"{"name":"a","exit_code":null,"signal":15,"died":null}"#)
                .expect("parses");
        assert_eq!(ended.signal, Some(15));
        let status: GroupStatus = serde_json::from_str(
            r#"{"state":"CREATED","scheduling_state":"SOMETHING_NEW","bundle_nodes":["n1",""]}"#,
        )
        .expect("parses");
        assert_eq!(status.state, GroupState::Created);
        assert_eq!(status.scheduling_state, SchedulingState::Unknown);
        let death: ActorDeath =
            serde_json::from_str(r#"{"kind":"from_the_future","message":"m"}"#).expect("parses");
        assert_eq!(death.kind, DeathKind::Other);
    }

    #[test]
    fn every_death_kind_the_bridge_sends_is_a_kind_of_its_own() {
        let script = crate::bridge::BRIDGE_SCRIPT;
        let table = script
            .split_once("DEATH_REASONS = {")
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(table, _)| table)
            .expect("the bridge maps Ray's death reasons in DEATH_REASONS");
        let mut sent: Vec<&str> = table
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(_, kind)| kind.trim().trim_end_matches(',').trim_matches('"'))
            .collect();
        assert_eq!(sent.len(), 4, "{table}");
        sent.extend(["out_of_memory", "unavailable"]);
        for kind in sent {
            assert!(script.contains(&format!("\"{kind}\"")), "{kind}");
            let parsed: DeathKind =
                serde_json::from_value(serde_json::json!(kind)).expect("a death kind");
            assert_ne!(parsed, DeathKind::Other, "{kind} is not a kind of its own");
        }
    }
}
