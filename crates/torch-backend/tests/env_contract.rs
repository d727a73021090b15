//! The environment every rank's task gets from the torch backend, on a two-node simulated run.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use trainyard_backend_executor::{BackendConfig, BackendExecutor, ExecutorOptions, FitReport};
use trainyard_config::{FailureConfig, RunConfig, ScalingConfig};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{FunctionRegistry, TaskSpec};
use trainyard_torch_backend::{InitMethod, ProcessGroupBackend, TorchConfig};

fn cluster(ip_a: &str, ip_b: &str, gpus: u32) -> SimRuntime {
    let functions =
        FunctionRegistry::with_builtins().register("env_then_fail_once", |task| async move {
            if task.var("TORCHELASTIC_RESTART_COUNT") == Some("0") && task.var("RANK") == Some("1")
            {
                return Err("first attempt fails".to_owned());
            }
            serde_json::to_value(task.env()).map_err(|e| e.to_string())
        });
    SimRuntime::new([
        SimNode::new("node-a").ip(ip_a).cpus(4).gpus(gpus),
        SimNode::new("node-b").ip(ip_b).cpus(4).gpus(gpus),
    ])
    .with_functions(functions)
}

async fn envs(
    sim: &SimRuntime,
    config: TorchConfig,
    scaling: ScalingConfig,
    run: RunConfig,
    task: &str,
) -> FitReport {
    let options = ExecutorOptions {
        poll_interval: Duration::from_millis(2),
        restart_backoff: trainyard_backend_executor::Backoff::NONE,
        ..ExecutorOptions::default()
    };
    BackendExecutor {
        backend: config.build(),
        scaling,
        run,
        options,
        ..BackendExecutor::new(Arc::new(sim.clone()))
    }
    .fit(&TaskSpec::Function {
        name: task.to_owned(),
        arg: Value::Null,
        env: BTreeMap::new(),
    })
    .await
    .expect("the run succeeds")
}

/// Four workers of 2 CPUs on two 4-CPU nodes: ranks 0 and 1 on node-a, 2 and 3 on node-b.
fn four_workers() -> ScalingConfig {
    ScalingConfig::default()
        .num_workers(4)
        .resources_per_worker("CPU=2".parse().expect("resources"))
}

fn var<'a>(env: &'a Value, name: &str) -> &'a str {
    env[name]
        .as_str()
        .unwrap_or_else(|| panic!("{name} is not set in {env}"))
}

#[tokio::test]
async fn every_rank_gets_the_torchrun_environment() {
    let sim = cluster("10.0.0.1", "10.0.0.2", 0);
    let report = envs(
        &sim,
        TorchConfig::default(),
        four_workers(),
        RunConfig::default(),
        "trainyard.env",
    )
    .await;
    let port = var(&report.returns[0], "MASTER_PORT").to_owned();
    assert!(port.parse::<u16>().is_ok(), "{port}");
    let expected = [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)];
    for (env, (rank, local, node)) in report.returns.iter().zip(expected) {
        assert_eq!(
            var(env, "MASTER_ADDR"),
            "10.0.0.1",
            "rank 0's node is the master"
        );
        assert_eq!(var(env, "MASTER_PORT"), port);
        assert_eq!(var(env, "RANK"), rank.to_string());
        assert_eq!(var(env, "LOCAL_RANK"), local.to_string());
        assert_eq!(var(env, "WORLD_SIZE"), "4");
        assert_eq!(var(env, "LOCAL_WORLD_SIZE"), "2");
        assert_eq!(var(env, "NODE_RANK"), node.to_string());
        assert_eq!(var(env, "GROUP_RANK"), node.to_string());
        assert_eq!(var(env, "ROLE_RANK"), rank.to_string());
        assert_eq!(var(env, "ROLE_WORLD_SIZE"), "4");
        assert_eq!(var(env, "ROLE_NAME"), "default");
        assert_eq!(var(env, "GROUP_WORLD_SIZE"), "2", "two nodes");
        assert_eq!(
            var(env, "TORCHELASTIC_RUN_ID"),
            var(env, "TRAINYARD_RUN_NAME"),
            "a run without a name given gets a generated one, which is its run id"
        );
        assert!(var(env, "TORCHELASTIC_RUN_ID").starts_with("trainyard-"));
        assert_eq!(var(env, "TORCHELASTIC_USE_AGENT_STORE"), "False");
        assert_eq!(var(env, "TORCHELASTIC_RESTART_COUNT"), "0");
        assert_eq!(var(env, "TORCHELASTIC_MAX_RESTARTS"), "0");
        assert_eq!(var(env, "TRAINYARD_TORCH_INIT_METHOD"), "env://");
        assert_eq!(var(env, "TRAINYARD_TORCH_BACKEND"), "gloo");
        assert_eq!(var(env, "TRAINYARD_TORCH_TIMEOUT_S"), "1800");
        assert_eq!(
            var(env, "OMP_NUM_THREADS"),
            "2",
            "from the worker's CPU request"
        );
        assert_eq!(var(env, "TRAINYARD_WORLD_RANK"), rank.to_string());
        assert!(
            env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING").is_none(),
            "gloo needs no NCCL settings"
        );
        assert!(env.get("CUDA_VISIBLE_DEVICES").is_none());
    }
}

#[tokio::test]
async fn gpu_workers_get_nccl_shared_devices_and_async_error_handling() {
    let sim = cluster("10.0.0.1", "10.0.0.2", 2);
    let scaling = ScalingConfig::default().num_workers(4).use_gpu(true);
    let report = envs(
        &sim,
        TorchConfig::default(),
        scaling,
        RunConfig::default(),
        "trainyard.env",
    )
    .await;
    for env in &report.returns {
        assert_eq!(var(env, "TRAINYARD_TORCH_BACKEND"), "nccl");
        assert_eq!(var(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
        assert_eq!(var(env, "CUDA_VISIBLE_DEVICES"), "0,1");
        assert_eq!(
            var(env, "OMP_NUM_THREADS"),
            "1",
            "a GPU-only worker still gets one thread"
        );
    }
}

#[tokio::test]
async fn variables_the_user_set_are_left_alone() {
    let sim = cluster("10.0.0.1", "10.0.0.2", 2);
    let scaling = ScalingConfig::default().num_workers(2).use_gpu(true);
    let run = RunConfig::default()
        .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        .env("OMP_NUM_THREADS", "7")
        .env("MASTER_ADDR", "10.0.0.9")
        .env("MASTER_PORT", "29400")
        .env("GLOO_SOCKET_IFNAME", "eth1");
    let report = envs(&sim, TorchConfig::default(), scaling, run, "trainyard.env").await;
    for env in &report.returns {
        assert_eq!(var(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
        assert_eq!(var(env, "OMP_NUM_THREADS"), "7");
        assert_eq!(var(env, "MASTER_ADDR"), "10.0.0.9");
        assert_eq!(var(env, "MASTER_PORT"), "29400");
        assert_eq!(var(env, "GLOO_SOCKET_IFNAME"), "eth1");
    }
}

#[tokio::test]
async fn tcp_init_gives_a_url_with_a_bracketed_ipv6_master() {
    let sim = cluster("fd00::1", "fd00::2", 0);
    let config = TorchConfig {
        init_method: InitMethod::Tcp,
        backend: ProcessGroupBackend::Gloo,
        ..TorchConfig::default()
    };
    let report = envs(
        &sim,
        config,
        four_workers(),
        RunConfig::default(),
        "trainyard.env",
    )
    .await;
    let url = var(&report.returns[0], "TRAINYARD_TORCH_INIT_METHOD").to_owned();
    assert!(url.starts_with("tcp://[fd00::1]:"), "{url}");
    for env in &report.returns {
        assert_eq!(var(env, "TRAINYARD_TORCH_INIT_METHOD"), url);
        assert!(
            env.get("MASTER_ADDR").is_none(),
            "tcp init does not use MASTER_ADDR"
        );
    }
}

#[tokio::test]
async fn the_restart_count_reaches_torchelastic_variables() {
    let sim = cluster("10.0.0.1", "10.0.0.2", 0);
    let run = RunConfig::default().failure_config(FailureConfig::restarts(2));
    let report = envs(
        &sim,
        TorchConfig::default(),
        four_workers(),
        run,
        "env_then_fail_once",
    )
    .await;
    assert_eq!(report.attempts, 2);
    for env in &report.returns {
        assert_eq!(var(env, "TORCHELASTIC_RESTART_COUNT"), "1");
        assert_eq!(var(env, "TRAINYARD_RESTART_COUNT"), "1");
        assert_eq!(var(env, "TORCHELASTIC_MAX_RESTARTS"), "2");
    }
}

#[tokio::test]
async fn the_run_id_is_the_runs_name() {
    let sim = cluster("10.0.0.1", "10.0.0.2", 0);
    let storage = tempfile::tempdir().expect("a temp dir");
    let run = RunConfig::default()
        .name("resnet")
        .storage_path(storage.path().display().to_string());
    let scaling = ScalingConfig::default().num_workers(2);
    let report = envs(&sim, TorchConfig::default(), scaling, run, "trainyard.env").await;
    for env in &report.returns {
        assert_eq!(var(env, "TORCHELASTIC_RUN_ID"), "resnet");
        assert_eq!(var(env, "TRAINYARD_RUN_NAME"), "resnet");
        assert_eq!(
            var(env, "GROUP_WORLD_SIZE"),
            "1",
            "both workers fit on one node"
        );
    }
}

#[tokio::test]
async fn every_variable_the_run_cannot_set_is_listed_as_reserved() {
    let sim = cluster("10.0.0.1", "10.0.0.2", 2);
    let scaling = ScalingConfig::default().num_workers(4).use_gpu(true);
    let config = TorchConfig::default();
    let reserved = config.build().reserved_env();
    let report = envs(&sim, config, scaling, RunConfig::default(), "trainyard.env").await;
    // Set only where the run's environment does not set them, or by accelerator sharing
    // from the GPUs each worker holds.
    let yielding = [
        "OMP_NUM_THREADS",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
    ];
    for env in &report.returns {
        let names = env.as_object().expect("an object of variables").keys();
        for name in names.filter(|name| !yielding.contains(&name.as_str())) {
            assert!(
                reserved.contains_key(name.as_str()),
                "{name} is set but not reserved"
            );
        }
    }
    for name in ["RANK", "TRAINYARD_TORCH_TIMEOUT_S", "TRAINYARD_WORLD_RANK"] {
        assert!(reserved.contains_key(name), "{name}");
    }
    let tcp = TorchConfig {
        init_method: InitMethod::Tcp,
        ..TorchConfig::default()
    };
    assert!(
        !tcp.build().reserved_env().contains_key("MASTER_ADDR"),
        "tcp init sets no MASTER_ADDR"
    );
}
