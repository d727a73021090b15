//! Flags of the `trainyard` command line, as in the CLI contract.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use trainyard::backend::{Backend, BackendConfig, NoBackend, default_rules};
use trainyard::torch::{TIMEOUT_VAR, TorchConfig};
use trainyard_config::resources::{ByteSize, ResourceAmount, Resources, near_reserved_name};
use trainyard_config::{
    NumWorkers, PlacementStrategy, ProgressSource, ResumePolicy, ScalingConfig,
};

use crate::values::{
    CheckpointScore, FlagError, ModuleList, RankList, at_least_one, checkpoint_score, env_pair,
    env_pattern, hang_timeout, mlflow_uri, module_list, notify_url, num_workers, parsed,
    positive_size, rank_list, resize_interval, seconds, slurm_name, slurm_signal, slurm_time,
    storage_location,
};
use crate::{Failure, inert};

/// Schedule and run the workers of distributed training jobs.
#[derive(Debug, Parser)]
#[command(name = "trainyard", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show what a scaling config resolves to: bundles, totals and each worker's options.
    Plan(PlanArgs),
    /// Run a program on every worker, with its rank and its framework's environment.
    Run(Box<RunArgs>),
    /// Show the nodes and resources of the runtime.
    Cluster(ClusterArgs),
    /// List the runs in a storage location, newest first: the live ones, or all with --all.
    Ps(PsArgs),
    /// Stop a run driven on this host as Ctrl-C does: the workers stop, the run can be resumed.
    Stop(StopArgs),
    /// Show one run: its record, attempts, checkpoints and metrics history.
    Show(ShowArgs),
    /// Print a run's rank logs merged by time; -f follows a live run until it ends.
    Logs(LogsArgs),
    /// Print every rank's stacks of a run driven on this host, as SIGQUIT in its terminal does.
    Stacks(StacksArgs),
    /// Serve a web page of the runs: live metric charts, attempts, logs, stacks, stop.
    Dashboard(DashboardArgs),
}

/// The DASHBOARD flags.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// The port to listen on; 0 picks a free one
    #[arg(long, default_value_t = 8270)]
    pub(crate) port: u16,
    /// The address to listen on (every request needs the token in the printed URL, loopback included)
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
}

/// The LOGS flags.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The run's name, as `trainyard ps` shows it
    pub(crate) name: String,
    /// Follow a live run: print lines as they come, go on into its next attempt when it restarts, end when it ends
    #[arg(long, short = 'f')]
    pub(crate) follow: bool,
    /// Only these ranks' lines, e.g. 0 or 0,2-3 [default: all]
    #[arg(long, value_name = "LIST", allow_hyphen_values = true, value_parser = rank_list)]
    pub(crate) rank: Option<RankList>,
    /// The attempt whose logs to print, counted from 0 over the run's restarts [default: the latest]
    #[arg(long, value_name = "K")]
    pub(crate) attempt: Option<usize>,
    /// Begin each line with the time the driver took it in (RFC 3339, UTC)
    #[arg(long, short = 't')]
    pub(crate) timestamps: bool,
    /// Only the last N lines written so far (with -f, then every new one)
    #[arg(long, value_name = "N")]
    pub(crate) tail: Option<usize>,
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
    /// Output format: json prints one object a line (time, attempt, rank, stream, line)
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

/// The STACKS flags.
#[derive(Debug, Args)]
pub(crate) struct StacksArgs {
    /// The run's name, as `trainyard ps` shows it
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
    /// Output format: json prints the dump's file and text
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

/// The SHOW flags.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The run's name, as `trainyard ps` shows it
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
    /// Output format: json holds the record and every report of every rank
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
    /// Write one self-contained web page with the record and a chart per metric to FILE instead
    #[arg(long, value_name = "FILE")]
    pub(crate) html: Option<PathBuf>,
}

/// The STOP flags.
#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    /// The run's name, as `trainyard ps` shows it
    pub(crate) name: String,
    /// Kill the workers at once instead of giving them their grace
    #[arg(long)]
    pub(crate) now: bool,
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
    /// Output format: json prints the run's name, its status after the stop, how long it took and what text would say
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

/// Where a day-two command finds the runs.
#[derive(Debug, Args)]
pub(crate) struct StorageArgs {
    /// Where run folders live: a path, file:///PATH or s3://BUCKET[/PREFIX] [default: $TRAINYARD_STORAGE, else ~/trainyard_results]
    #[arg(long, value_name = "URI", value_parser = storage_location)]
    pub(crate) storage: Option<String>,
}

impl StorageArgs {
    /// The storage given: the flag, else `$TRAINYARD_STORAGE`; `None` for the default.
    pub(crate) fn given(&self) -> Option<String> {
        storage_given(self.storage.as_deref())
    }
}

/// The storage `flag` or `$TRAINYARD_STORAGE` names, as `trainyard run` and the day-two
/// commands take it; `None` (the default, `~/trainyard_results`) when neither says.
/// The `--notify` URL: the flag's, else `$TRAINYARD_NOTIFY` (empty is none).
pub(crate) fn notify_given(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| std::env::var(crate::secrets::NOTIFY_VAR).ok())
        .filter(|url| !url.is_empty())
}

pub(crate) fn storage_given(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| std::env::var("TRAINYARD_STORAGE").ok())
        .filter(|storage| !storage.is_empty())
}

/// The PS flags.
#[derive(Debug, Args)]
pub(crate) struct PsArgs {
    /// Every run, not only the live ones
    #[arg(long, short = 'a')]
    pub(crate) all: bool,
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
    /// Output format
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

/// The RUN flags.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) scaling: ScalingArgs,
    /// torchrun's spelling of -n: N workers on this machine (--runtime local, one node; on Ray or with --nodes the workers span nodes and -n is their total)
    // A flag of its own rather than an alias of -n: the two mean the same only on one
    // node, and only a flag of its own can be told apart, to be refused where they differ.
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc_per_node",
        value_name = "N",
        allow_negative_numbers = true,
        conflicts_with = "num_workers"
    )]
    pub(crate) nproc_per_node: Option<i64>,
    #[command(flatten)]
    pub(crate) local: LocalArgs,
    /// Where the workers run: local (this machine), ray or slurm
    #[arg(long, value_enum, default_value_t = RuntimeKind::Local)]
    pub(crate) runtime: RuntimeKind,
    #[command(flatten)]
    pub(crate) ray: RayArgs,
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// Run in the background: return once the workers are starting, printing the run's name and how to follow it (trainyard logs NAME -f); on Slurm the whole run is submitted as a batch job whose script is this same command, and its job id is printed
    #[arg(long)]
    pub(crate) detach: bool,
    /// Where a --detach run's driver output goes; on Slurm %j is the job id [default: the run folder's driver-TIME.log (local storage), else trainyard-NAME.out, on Slurm trainyard-%j.out, in this directory]
    #[arg(long, value_name = "FILE", requires = "detach")]
    pub(crate) output: Option<PathBuf>,
    /// The framework whose environment the workers get: torch sets PyTorch's process-group variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and logs `Setting up process group for: env://...`; none runs plain commands without them (the TRAINYARD_* ranks only)
    #[arg(long, value_enum, default_value_t = BackendKind::Torch)]
    pub(crate) backend: BackendKind,
    /// Restarts allowed after a failure; -1 is unlimited [default: 0]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        visible_aliases = ["max-restarts", "max_restarts"]
    )]
    pub(crate) max_failures: Option<i64>,
    /// An environment variable for every worker (repeatable): K=V, or K alone for the value K has in this environment (a secret stays off the command line, which every user can read); not one that trainyard sets itself (RANK, WORLD_SIZE, ...); MASTER_ADDR and MASTER_PORT given here are the rendezvous (every rank's host must reach them before its task starts), and GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME the interface, instead of the ones trainyard chooses
    #[arg(long = "env", value_name = "K=V|K", value_parser = env_pair)]
    pub(crate) env: Vec<(String, String)>,
    /// Environment variables for every worker from FILE (repeatable): one K=V a line, or K alone for its value in this environment; blank lines and # comments are passed over; --env wins
    #[arg(long, value_name = "FILE")]
    pub(crate) env_file: Vec<PathBuf>,
    /// The process-group timeout, in seconds, that the workers are given in TRAINYARD_TORCH_TIMEOUT_S (Ray's TorchConfig.timeout_s; --backend torch) [default: 1800]
    #[arg(long, value_name = "SECS", value_parser = parse_torch_timeout)]
    pub(crate) torch_timeout: Option<u64>,
    /// Driver variables a remote runtime copies to the workers (repeatable; the local runtime passes the whole environment)
    #[arg(long, value_name = "PATTERN", value_parser = env_pattern)]
    pub(crate) env_from_driver: Vec<String>,
    /// Seconds to wait for the placement group [default: 100]
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    pub(crate) placement_timeout: Option<Duration>,
    /// Fail at once (exit 3) instead of waiting when other runs on this machine hold what the run needs
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Wait for resources the Ray cluster does not have yet (an autoscaler adds nodes), up to the placement timeout, instead of failing at once
    #[arg(long)]
    pub(crate) wait_for_resources: bool,
    /// Log format: text, or json for one structured event per line
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// After the run, show where the launch went: each phase's time, with the spread over workers (in JSON, a `timings` event)
    #[arg(long)]
    pub(crate) timings: bool,
    /// The run's name: its folder is STORAGE/NAME; an unfinished run of that name resumes from its latest checkpoint [default: a generated one]
    #[arg(long, value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// Where run folders live: a path, file:///PATH or s3://BUCKET[/PREFIX] [default: $TRAINYARD_STORAGE, else ~/trainyard_results]
    #[arg(long, value_name = "PATH|URI", value_parser = storage_location)]
    pub(crate) storage: Option<String>,
    /// auto: resume an unfinished run of the same name and storage, refuse a finished one; always: resume it even when finished, training on from its latest checkpoint (Ray Train v2's behaviour); never: start afresh in a new folder
    #[arg(long, value_name = "auto|always|never", default_value = "auto", value_parser = parsed::<ResumePolicy>)]
    pub(crate) resume: ResumePolicy,
    /// How many committed checkpoints to keep (the best by --checkpoint-score, else the newest; the latest is always kept) [default: all]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) checkpoints_to_keep: Option<u32>,
    /// The reported metric that ranks checkpoints, and which way is better [default order: max]
    #[arg(long, value_name = "ATTR[:min|max]", value_parser = checkpoint_score)]
    pub(crate) checkpoint_score: Option<CheckpointScore>,
    /// The most bytes one rank may hand in for one checkpoint, e.g. 20GB; a larger hand-in fails that rank's report [default: no limit]
    #[arg(long, value_name = "SIZE", value_parser = positive_size)]
    pub(crate) max_checkpoint_size: Option<ByteSize>,
    /// Start Python tasks from a warm interpreter that imported MODULES once (comma-separated, e.g. torch): a restarted rank trains again without starting Python and importing them. The program then sees MODULES imported before its __main__ runs; its interpreter options other than -u, -B, -m and -c start it cold. Locally one warm interpreter serves the run; on Ray and Slurm each worker's agent starts its own, next to it [default: off]
    #[arg(long, value_name = "MODULES", value_parser = module_list)]
    pub(crate) warm_python: Option<ModuleList>,
    /// Judge a rank hung after this long without progress (a report; with --progress output, a line too): its stacks are printed and the attempt restarts under --max-failures, e.g. 90s, 10m [default: off]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = hang_timeout)]
    pub(crate) hang_timeout: Option<Duration>,
    /// What counts as progress for --hang-timeout: reports, or output (any line, for programs that do not report)
    #[arg(long, value_name = "reports|output", default_value = "reports", value_parser = parsed::<ProgressSource>)]
    pub(crate) progress: ProgressSource,
    /// Where each rank's output is written, one file a rank and attempt (DIR/attempt_K/rank_R.log) [default: the run folder's logs/]
    #[arg(long, value_name = "DIR")]
    pub(crate) log_dir: Option<PathBuf>,
    /// POST the run's changes of state (attempt started, restarting, resized, checkpoint committed, and how it ended) as JSON to this http:// or https:// URL [default: $TRAINYARD_NOTIFY, where a URL with a token in it stays off the command line]
    #[arg(long, value_name = "URL", value_parser = notify_url)]
    pub(crate) notify: Option<String>,
    /// Keep the run in this MLflow tracking server (http://HOST:PORT): one MLflow run over restarts and resumes, with the configuration as parameters, rank 0's metrics at their steps and the checkpoints as tags; $MLFLOW_EXPERIMENT_NAME names its experiment
    #[arg(long, value_name = "URI", value_parser = mlflow_uri)]
    pub(crate) mlflow: Option<String>,
    /// Write TensorBoard event files of rank 0's numeric metrics to DIR (tensorboard --logdir DIR reads them as the run goes)
    #[arg(long, value_name = "DIR")]
    pub(crate) tensorboard: Option<PathBuf>,
    /// Show only these ranks' output on the console, e.g. 0 or 0,2-3; the log files keep every rank's [default: all]
    #[arg(long, value_name = "LIST", allow_hyphen_values = true, value_parser = rank_list)]
    pub(crate) ranks: Option<RankList>,
    /// The program to run on every worker, and its arguments: the first word that is not a flag, or everything after `--`; the flags after it are the program's
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true
    )]
    pub(crate) program: Vec<String>,
}

/// The longest `--torch-timeout`: a year, well within what every clock and `timedelta` of
/// torch holds.
const MAX_TORCH_TIMEOUT_S: u64 = 365 * 24 * 3600;

/// `--torch-timeout`: whole seconds, from 1 to [`MAX_TORCH_TIMEOUT_S`].
fn parse_torch_timeout(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|secs| (1..=MAX_TORCH_TIMEOUT_S).contains(secs))
        .ok_or_else(|| {
            format!("expected a whole number of seconds from 1 to {MAX_TORCH_TIMEOUT_S} (a year)")
        })
}

impl RunArgs {
    /// The scaling config of the SCALING flags, with `--nproc-per-node` as `-n`.
    pub(crate) fn scaling_config(&self) -> Result<ScalingConfig, Failure> {
        let num_workers = match (self.scaling.num_workers, self.nproc_per_node) {
            (None, Some(n)) => Some(
                n.to_string()
                    .parse::<NumWorkers>()
                    .map_err(Failure::bad_input)?,
            ),
            (given, _) => given,
        };
        self.scaling.to_config_with_workers(num_workers)
    }

    /// The torch backend's configuration: the default one, with `--torch-timeout`.
    pub(crate) fn torch_config(&self) -> TorchConfig {
        let mut config = TorchConfig::default();
        if let Some(secs) = self.torch_timeout {
            config.timeout_s = secs;
        }
        config
    }

    /// The backend that `--backend` names, configured by the flags.
    pub(crate) fn backend(&self) -> Arc<dyn Backend> {
        match self.backend {
            BackendKind::Torch => self.torch_config().build(),
            BackendKind::None => NoBackend.build(),
        }
    }
}

/// A `--env KEY=VALUE` that sets a variable trainyard sets itself (`reserved`, with what
/// its value is), which would be replaced: the error names it and the flag that sets it
/// instead, where one does.
pub(crate) fn reserved_env_error(
    pair: &str,
    key: &str,
    reserved: &BTreeMap<&'static str, &'static str>,
) -> Option<FlagError> {
    let meaning = reserved.get(key)?;
    let instead = match flag_setting(key) {
        Some(flag) => format!("set it with {flag}"),
        None => "it cannot be set".to_owned(),
    };
    Some(FlagError::new("--env", pair)(
        format!("trainyard sets `{key}` on every worker ({meaning}); {instead}").into(),
    ))
}

/// A `--env MASTER_PORT=VALUE` (the rendezvous' port, given instead of the one trainyard
/// finds free) that is not a port number.
pub(crate) fn master_port_error(env: &BTreeMap<String, String>) -> Option<FlagError> {
    let value = env.get("MASTER_PORT")?;
    if value.parse::<u16>().is_ok_and(|port| port > 0) {
        return None;
    }
    Some(FlagError::new("--env", &format!("MASTER_PORT={value}"))(
        "expected a port number from 1 to 65535 (the rendezvous' port; without it trainyard finds a free one on rank 0's node)".into(),
    ))
}

/// The flag that sets a variable trainyard sets on every worker, where one does.
fn flag_setting(name: &str) -> Option<&'static str> {
    use trainyard::backend::{RUN_NAME, WORLD_SIZE as TRAINYARD_WORLD_SIZE};
    match name {
        TIMEOUT_VAR => Some("--torch-timeout SECS"),
        RUN_NAME | "TORCHELASTIC_RUN_ID" => Some("--name NAME"),
        "TORCHELASTIC_MAX_RESTARTS" => Some("--max-failures N (or --max-restarts N)"),
        TRAINYARD_WORLD_SIZE | "WORLD_SIZE" | "ROLE_WORLD_SIZE" => Some("-n N"),
        _ => None,
    }
}

/// A `--env` variable that accelerator sharing sets on every worker requesting its
/// resource (`CUDA_VISIBLE_DEVICES` for `GPU`), which would be replaced by the ids of the
/// devices the run holds on the worker's node.
pub(crate) fn shared_accelerator_error(
    env: &BTreeMap<String, String>,
    worker: &Resources,
    share_gpus: bool,
) -> Option<FlagError> {
    default_rules(share_gpus).into_iter().find_map(|rule| {
        let value = env.get(&rule.env_var)?;
        if worker.amount(&rule.resource).is_zero() {
            return None;
        }
        let pair = format!("{}={value}", rule.env_var);
        Some(FlagError::new("--env", &pair)(
            format!(
                "trainyard sets `{}` on every worker that requests {} to the ids of the devices the run holds on its node; \
                 to choose the devices of this machine that workers may be given, set it in trainyard's own environment",
                rule.env_var, rule.resource
            )
            .into(),
        ))
    })
}

/// The RAY flags: which Ray cluster.
#[derive(Debug, Args)]
pub(crate) struct RayArgs {
    /// Ray cluster address HOST:PORT (runtime ray) [default: $RAY_ADDRESS, else a throwaway local head]
    #[arg(long, value_name = "ADDR")]
    pub(crate) address: Option<String>,
}

/// The SLURM flags: what an allocation of the run's own is requested with (outside an
/// allocation; inside one, `$SLURM_JOB_ID`'s is used).
#[derive(Debug, Args)]
pub(crate) struct SlurmArgs {
    /// Slurm partition for the run's allocation (runtime slurm) [default: the cluster's default partition]
    #[arg(long, value_name = "P", value_parser = slurm_name)]
    pub(crate) partition: Option<String>,
    /// Slurm account the allocation is charged to (runtime slurm)
    #[arg(long, value_name = "A", value_parser = slurm_name)]
    pub(crate) account: Option<String>,
    /// Slurm quality of service of the allocation (runtime slurm)
    #[arg(long, value_name = "Q", value_parser = slurm_name)]
    pub(crate) qos: Option<String>,
    /// Time limit of the allocation (runtime slurm), in Slurm's forms: MINUTES, H:MM:SS, D-HH[:MM[:SS]]
    #[arg(long, value_name = "T", value_parser = slurm_time)]
    pub(crate) time: Option<String>,
    /// Have Slurm signal the workers this long before the time limit or a preemption, e.g. USR1@90 (runtime slurm); the tasks get the signal
    #[arg(long, value_name = "SIG@SECS", value_parser = slurm_signal)]
    pub(crate) signal: Option<String>,
}

/// `cluster`'s flags.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    #[command(flatten)]
    pub(crate) local: LocalArgs,
    /// Where the workers run: local (this machine), ray or slurm
    #[arg(long, value_enum, default_value_t = RuntimeKind::Local)]
    pub(crate) runtime: RuntimeKind,
    #[command(flatten)]
    pub(crate) ray: RayArgs,
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// Output format
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

/// The LOCAL flags: what this machine offers, detected unless given.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// CPUs the workers may use [default: detected]
    #[arg(long, value_name = "N", value_parser = parsed::<ResourceAmount>)]
    pub(crate) num_cpus: Option<ResourceAmount>,
    /// GPUs the workers may use [default: detected]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) num_gpus: Option<i64>,
    /// Memory the workers may use, e.g. 16GB [default: detected]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = parsed::<ByteSize>)]
    pub(crate) memory: Option<ByteSize>,
    /// Custom resources of this machine: JSON object or K=V list
    #[arg(long, value_name = "SPEC", value_parser = parsed::<Resources>)]
    pub(crate) resources: Option<Resources>,
    /// Split this machine into N virtual nodes [default: 1]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) nodes: Option<i64>,
    /// Give each worker a hard memory limit (its `memory`): a cgroup, else RLIMIT_AS
    #[arg(long)]
    pub(crate) enforce_memory: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum RuntimeKind {
    Local,
    Ray,
    Slurm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    Torch,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The SCALING flags shared by `plan` and `run`.
#[derive(Debug, Args)]
pub(crate) struct ScalingArgs {
    /// Number of workers, or an elastic range MIN:MAX (starts once MIN fit, grows up to MAX) [default: 1]
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true, value_parser = num_workers)]
    pub(crate) num_workers: Option<NumWorkers>,
    /// How often an elastic run (-n MIN:MAX) looks for room to grow, e.g. 30s or 5m [default: 60s; the local runtime also looks as soon as another run releases resources]
    #[arg(long, value_name = "DURATION", value_parser = resize_interval)]
    pub(crate) resize_interval: Option<Duration>,
    /// Give each worker a GPU (1 unless --resources-per-worker says otherwise)
    #[arg(long)]
    pub(crate) use_gpu: bool,
    /// Resources of each worker: JSON object or K=V list, e.g. '{"CPU":1,"memory":"10GB"}' or CPU=1,memory=10GB,custom=2
    #[arg(short = 'r', long, value_name = "SPEC", value_parser = parsed::<Resources>)]
    pub(crate) resources_per_worker: Option<Resources>,
    /// Resources the coordinator reserves next to rank 0 (JSON object or K=V list)
    #[arg(long, value_name = "SPEC", value_parser = parsed::<Resources>)]
    pub(crate) trainer_resources: Option<Resources>,
    /// PACK, SPREAD, STRICT_PACK or STRICT_SPREAD [default: PACK]
    #[arg(short = 's', long, value_name = "STRATEGY", value_parser = parsed::<PlacementStrategy>)]
    pub(crate) placement_strategy: Option<PlacementStrategy>,
    /// Accelerator type every worker's node must have, e.g. A100
    #[arg(long, value_name = "NAME")]
    pub(crate) accelerator_type: Option<String>,
    /// TOML or JSON file with the fields of ScalingConfig; flags override it
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) scaling: ScalingArgs,
    /// Also place the plan on this runtime's cluster as it is now, reserving nothing
    #[arg(long, value_enum, conflicts_with = "cluster")]
    pub(crate) runtime: Option<RuntimeKind>,
    /// Also place the plan on the cluster this TOML or JSON file describes (`[[nodes]]` with `resources`, optional `id` and `count`)
    #[arg(long, value_name = "FILE")]
    pub(crate) cluster: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) local: LocalArgs,
    #[command(flatten)]
    pub(crate) ray: RayArgs,
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// Output format
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Text,
    Json,
}

impl ScalingArgs {
    /// The config file (if any) with the flags laid over it, validated.
    pub(crate) fn to_config(&self) -> Result<ScalingConfig, Failure> {
        self.to_config_with_workers(self.num_workers)
    }

    /// [`to_config`](Self::to_config) with `num_workers` for `-n`.
    fn to_config_with_workers(
        &self,
        num_workers: Option<NumWorkers>,
    ) -> Result<ScalingConfig, Failure> {
        let mut config = match &self.config {
            Some(path) => ScalingConfig::parse_file(path).map_err(Failure::bad_input)?,
            None => ScalingConfig::default(),
        };
        if let Some(n) = num_workers {
            config.num_workers = n;
        }
        if let Some(interval) = self.resize_interval {
            config.resize_interval = Some(interval);
        }
        if self.use_gpu {
            config.use_gpu = true;
        }
        if let Some(spec) = &self.resources_per_worker {
            config.resources_per_worker = Some(spec.clone());
        }
        if let Some(spec) = &self.trainer_resources {
            config.trainer_resources = Some(spec.clone());
        }
        if let Some(strategy) = self.placement_strategy {
            config.placement_strategy = strategy;
        }
        if let Some(accelerator) = &self.accelerator_type {
            config.accelerator_type = Some(accelerator.clone());
        }
        config.validate().map_err(Failure::bad_input)?;
        warn_case_mistakes(
            config
                .resources_per_worker
                .iter()
                .chain(&config.trainer_resources),
        );
        Ok(config)
    }
}

/// One warning line on stderr per resource name that differs from a well-known one only by
/// case (`cpu` for `CPU`): such a name is a custom resource that no node is likely to offer.
pub(crate) fn warn_case_mistakes<'a>(specs: impl IntoIterator<Item = &'a Resources>) {
    let mistaken: BTreeSet<(&str, &str)> = specs
        .into_iter()
        .flat_map(Resources::names)
        .filter_map(|name| Some((name, near_reserved_name(name)?)))
        .collect();
    for (name, meant) in mistaken {
        say!(
            "warning: resource `{}` is not `{meant}`; resource names are case-sensitive",
            inert(name)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `trainyard run ARGS`, parsed.
    fn run_args(args: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(["trainyard", "run"].iter().chain(args))
            .unwrap_or_else(|e| panic!("{args:?} does not parse: {e}"));
        match cli.command {
            Command::Run(args) => *args,
            other => panic!("not a run: {other:?}"),
        }
    }

    #[test]
    fn the_first_word_that_is_not_a_flag_starts_the_program_and_its_flags_are_its_own() {
        let with_dashes = run_args(&["-n", "2", "--", "python", "x.py", "--name", "y"]);
        let without = run_args(&["-n", "2", "python", "x.py", "--name", "y"]);
        for args in [&with_dashes, &without] {
            assert_eq!(args.program, ["python", "x.py", "--name", "y"]);
            assert_eq!(args.name, None, "--name after the program is the program's");
            assert_eq!(
                args.scaling.num_workers.map(|n| n.to_string()).as_deref(),
                Some("2")
            );
        }
        let args = run_args(&["--name", "a", "python", "-n", "3", "--", "b"]);
        assert_eq!(args.name.as_deref(), Some("a"));
        assert_eq!(args.program, ["python", "-n", "3", "--", "b"]);
        assert_eq!(args.scaling.num_workers, None);
    }

    #[test]
    fn a_flag_trainyard_does_not_know_before_the_program_is_refused_not_run() {
        let error = Cli::try_parse_from(["trainyard", "run", "--nmae", "x", "python"])
            .expect_err("an unknown flag");
        assert_eq!(error.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn torchruns_spellings_set_the_workers_and_the_restarts() {
        for spelling in [
            &["--nproc-per-node", "3"][..],
            &["--nproc_per_node", "3"],
            &["--nproc-per-node=3"],
        ] {
            let args = run_args(&[spelling, &["--max-restarts", "2", "true"]].concat());
            let scaling = args.scaling_config().expect("a valid scaling config");
            assert_eq!(scaling.num_workers, 3, "{spelling:?}");
            assert_eq!(args.max_failures, Some(2));
        }
        assert_eq!(
            run_args(&["--max_restarts", "-1", "true"]).max_failures,
            Some(-1)
        );
    }

    #[test]
    fn the_torch_timeout_reaches_the_torch_config_and_is_bounded() {
        let args = run_args(&["--torch-timeout", "60", "true"]);
        assert_eq!(args.torch_config().timeout_s, 60);
        assert_eq!(
            run_args(&["true"]).torch_config(),
            TorchConfig::default(),
            "Ray's 1800 s unless given"
        );
        for bad in ["0", "-1", "1.5", "soon", "31536001"] {
            assert!(parse_torch_timeout(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_torch_timeout("31536000"), Ok(MAX_TORCH_TIMEOUT_S));
    }

    #[test]
    fn a_reserved_variable_is_refused_naming_the_flag_that_sets_it() {
        let reserved = run_args(&["true"]).backend().reserved_env();
        let message = |pair: &str| {
            let key = pair.split_once('=').map_or(pair, |(key, _)| key);
            reserved_env_error(pair, key, &reserved).map(|error| {
                let source = std::error::Error::source(&error).map(ToString::to_string);
                format!("{error}: {}", source.unwrap_or_default())
            })
        };
        assert_eq!(
            message("TRAINYARD_TORCH_TIMEOUT_S=10").as_deref(),
            Some(
                "invalid value `TRAINYARD_TORCH_TIMEOUT_S=10` for `--env`: trainyard sets `TRAINYARD_TORCH_TIMEOUT_S` on every worker (the process-group timeout in seconds); set it with --torch-timeout SECS"
            )
        );
        assert!(message("RANK=7").is_some_and(|m| m.ends_with("it cannot be set")));
        assert!(
            message("OMP_NUM_THREADS=4").is_none(),
            "the backend yields it"
        );
        assert!(message("TORCH_NCCL_ASYNC_ERROR_HANDLING=0").is_none());
        let none = run_args(&["--backend", "none", "true"])
            .backend()
            .reserved_env();
        assert!(
            !none.contains_key("RANK"),
            "no backend, no torchrun variables"
        );
        assert!(none.contains_key("TRAINYARD_WORLD_RANK"));
    }

    #[test]
    fn a_sharing_variable_is_refused_only_for_workers_that_request_its_resource() {
        let env = BTreeMap::from([("CUDA_VISIBLE_DEVICES".to_owned(), "1".to_owned())]);
        let gpu: Resources = "CPU=1,GPU=1".parse().expect("resources");
        let cpu: Resources = "CPU=1".parse().expect("resources");
        assert!(shared_accelerator_error(&env, &gpu, true).is_some());
        assert!(
            shared_accelerator_error(&env, &cpu, true).is_none(),
            "hiding the GPUs from CPU workers is the user's to do"
        );
    }
}
