//! For tests that play the driver against a real agent: their own test binary, started
//! again to run only the test that serves as an agent (one that calls
//! `trainyard_agent::run_if_agent`).

use std::collections::BTreeMap;
use std::process::Stdio;

use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, Command};
use trainyard_runtime::{ActorId, NodeId};

use crate::config::{AgentConfig, token_line};
use crate::token::Token;

/// The configuration of an agent of `actor` on this machine (`node-0`, `127.0.0.1`), that
/// connects to `driver`, whose parent is this process: no accelerators, no memory limit, a
/// grace and a heartbeat of a second each, and a lost-driver bound of ten minutes (a test's
/// driver says nothing while it waits). A test changes what it needs with `..`.
#[must_use]
pub fn local_agent_config(driver: String, actor: ActorId) -> AgentConfig {
    AgentConfig {
        driver,
        actor,
        parent: std::process::id(),
        node_id: NodeId("node-0".to_owned()),
        node_ip: "127.0.0.1".to_owned(),
        accelerator_ids: BTreeMap::new(),
        memory: None,
        grace_ms: 1_000,
        heartbeat_ms: 1_000,
        driver_lost_ms: 600_000,
        scheduler_stops: false,
        warm_python: None,
        start_warm_python: None,
    }
}

/// Starts this test binary again as an agent configured by `config`, running only the test
/// named `entry` (its full name in the binary, as `--exact` takes it), and hands it `token`
/// on its stdin. Its stdout goes nowhere and its stderr to `stderr`; it is killed when the
/// returned [`Child`] is dropped.
///
/// # Panics
/// When the binary cannot be started or the token not written.
pub async fn start_agent(entry: &str, config: &AgentConfig, token: &Token, stderr: Stdio) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut agent = Command::new(exe)
        .args(["--exact", entry, "--nocapture", "--test-threads=1", "-q"])
        .envs(config.to_env().expect("serialisable"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("the agent starts");
    let mut stdin = agent.stdin.take().expect("piped stdin");
    stdin
        .write_all(token_line(token).as_bytes())
        .await
        .expect("the token is written");
    drop(stdin);
    agent
}
