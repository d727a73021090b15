//! Flags of the `trainyard` command line, as in the CLI contract.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use trainyard_config::resources::{Resources, near_reserved_name};
use trainyard_config::{ScalingConfig, checked_num_workers};

use crate::{Failure, escape_newlines};

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
}

/// The RUN flags.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) scaling: ScalingArgs,
    #[command(flatten)]
    pub(crate) local: LocalArgs,
    /// Where the workers run: local (this machine) or ray
    #[arg(long, value_enum, default_value_t = RuntimeKind::Local)]
    pub(crate) runtime: RuntimeKind,
    #[command(flatten)]
    pub(crate) ray: RayArgs,
    /// The framework whose environment the workers get
    #[arg(long, value_enum, default_value_t = BackendKind::Torch)]
    pub(crate) backend: BackendKind,
    /// Restarts allowed after a failure; -1 is unlimited [default: 0]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) max_failures: Option<i64>,
    /// An environment variable for every worker (repeatable)
    #[arg(long = "env", value_name = "K=V")]
    pub(crate) env: Vec<String>,
    /// Driver variables a remote runtime copies to the workers (repeatable; the local runtime passes the whole environment)
    #[arg(long, value_name = "PATTERN")]
    pub(crate) env_from_driver: Vec<String>,
    /// Seconds to wait for the placement group [default: 100]
    #[arg(long, value_name = "SECS")]
    pub(crate) placement_timeout: Option<String>,
    /// Fail at once (exit 3) instead of waiting when other runs on this machine hold what the run needs
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Wait for resources the Ray cluster does not have yet (an autoscaler adds nodes), up to the placement timeout, instead of failing at once
    #[arg(long)]
    pub(crate) wait_for_resources: bool,
    /// Log format: text, or json for one structured event per line
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// The run's name: its folder is STORAGE/NAME; an unfinished run of that name resumes from its latest checkpoint [default: a generated one]
    #[arg(long, value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// Where run folders live: a path, file:///PATH or s3://BUCKET[/PREFIX] [default: $TRAINYARD_STORAGE, else ~/trainyard_results]
    #[arg(long, value_name = "PATH|URI")]
    pub(crate) storage: Option<String>,
    /// auto: resume an unfinished run of the same name and storage, refuse a finished one; never: start afresh in a new folder
    #[arg(long, value_name = "auto|never", default_value = "auto")]
    pub(crate) resume: String,
    /// How many committed checkpoints to keep (the best by --checkpoint-score, else the newest; the latest is always kept) [default: all]
    #[arg(long, value_name = "N")]
    pub(crate) checkpoints_to_keep: Option<String>,
    /// The reported metric that ranks checkpoints, and which way is better [default order: max]
    #[arg(long, value_name = "ATTR[:min|max]")]
    pub(crate) checkpoint_score: Option<String>,
    /// Judge a rank hung after this long without progress (a report; with --progress output, a line too): its stacks are printed and the attempt restarts under --max-failures, e.g. 90s, 10m [default: off]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub(crate) hang_timeout: Option<String>,
    /// What counts as progress for --hang-timeout: reports, or output (any line, for programs that do not report)
    #[arg(long, value_name = "reports|output", default_value = "reports")]
    pub(crate) progress: String,
    /// Where each rank's output is written, one file a rank and attempt (DIR/attempt_K/rank_R.log) [default: the run folder's logs/]
    #[arg(long, value_name = "DIR")]
    pub(crate) log_dir: Option<PathBuf>,
    /// Show only these ranks' output on the console, e.g. 0 or 0,2-3; the log files keep every rank's [default: all]
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub(crate) ranks: Option<String>,
    /// The program to run on every worker, and its arguments
    #[arg(last = true, value_name = "PROGRAM", required = true, num_args = 1..)]
    pub(crate) program: Vec<String>,
}

/// The RAY flags: which Ray cluster.
#[derive(Debug, Args)]
pub(crate) struct RayArgs {
    /// Ray cluster address HOST:PORT (runtime ray) [default: $RAY_ADDRESS, else a throwaway local head]
    #[arg(long, value_name = "ADDR")]
    pub(crate) address: Option<String>,
}

/// `cluster`'s flags.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    #[command(flatten)]
    pub(crate) local: LocalArgs,
    /// Where the workers run: local (this machine) or ray
    #[arg(long, value_enum, default_value_t = RuntimeKind::Local)]
    pub(crate) runtime: RuntimeKind,
    #[command(flatten)]
    pub(crate) ray: RayArgs,
    /// Output format
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

/// The LOCAL flags: what this machine offers, detected unless given.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// CPUs the workers may use [default: detected]
    #[arg(long, value_name = "N")]
    pub(crate) num_cpus: Option<String>,
    /// GPUs the workers may use [default: detected]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) num_gpus: Option<i64>,
    /// Memory the workers may use, e.g. 16GB [default: detected]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub(crate) memory: Option<String>,
    /// Custom resources of this machine: JSON object or K=V list
    #[arg(long, value_name = "SPEC")]
    pub(crate) resources: Option<String>,
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
    /// Number of workers [default: 1]
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) num_workers: Option<i64>,
    /// Give each worker a GPU (1 unless --resources-per-worker says otherwise)
    #[arg(long)]
    pub(crate) use_gpu: bool,
    /// Resources of each worker: JSON object or K=V list, e.g. '{"CPU":1,"memory":"10GB"}' or CPU=1,memory=10GB,custom=2
    #[arg(short = 'r', long, value_name = "SPEC")]
    pub(crate) resources_per_worker: Option<String>,
    /// Resources the coordinator reserves next to rank 0 (JSON object or K=V list)
    #[arg(long, value_name = "SPEC")]
    pub(crate) trainer_resources: Option<String>,
    /// PACK, SPREAD, STRICT_PACK or STRICT_SPREAD [default: PACK]
    #[arg(short = 's', long, value_name = "STRATEGY")]
    pub(crate) placement_strategy: Option<String>,
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
    /// Output format
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) format: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Text,
    Json,
}

/// A flag whose value is not acceptable; the value is shown with its newlines escaped so
/// that the error stays on one line.
#[derive(Debug, thiserror::Error)]
#[error("invalid value `{}` for `{flag}`", escape_newlines(value))]
pub(crate) struct FlagError {
    flag: &'static str,
    value: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl FlagError {
    pub(crate) fn new(
        flag: &'static str,
        value: &str,
    ) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> Self + use<> {
        let value = value.to_owned();
        move |source| Self {
            flag,
            value,
            source,
        }
    }
}

pub(crate) fn parse_flag<T>(flag: &'static str, value: &str) -> Result<T, FlagError>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    value
        .parse()
        .map_err(|e: T::Err| FlagError::new(flag, value)(Box::new(e)))
}

impl ScalingArgs {
    /// The config file (if any) with the flags laid over it, validated.
    pub(crate) fn to_config(&self) -> Result<ScalingConfig, Failure> {
        let mut config = match &self.config {
            Some(path) => ScalingConfig::parse_file(path).map_err(Failure::bad_input)?,
            None => ScalingConfig::default(),
        };
        if let Some(n) = self.num_workers {
            config.num_workers = checked_num_workers(n).map_err(Failure::bad_input)?;
        }
        if self.use_gpu {
            config.use_gpu = true;
        }
        if let Some(spec) = &self.resources_per_worker {
            config.resources_per_worker =
                Some(parse_flag("--resources-per-worker", spec).map_err(Failure::bad_input)?);
        }
        if let Some(spec) = &self.trainer_resources {
            config.trainer_resources =
                Some(parse_flag("--trainer-resources", spec).map_err(Failure::bad_input)?);
        }
        if let Some(strategy) = &self.placement_strategy {
            config.placement_strategy =
                parse_flag("--placement-strategy", strategy).map_err(Failure::bad_input)?;
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
        eprintln!(
            "warning: resource `{}` is not `{meant}`; resource names are case-sensitive",
            escape_newlines(name)
        );
    }
}
