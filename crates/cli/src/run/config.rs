//! The RUN flags turned into the run's configuration: what it runs, on what, and how its
//! runtime starts. Each flag's value was checked as it was parsed ([`crate::values`]); what
//! depends on several flags (a flag that another runtime or backend reads, a variable
//! trainyard sets itself, ranks beyond the number of workers) is checked here.

use std::collections::{BTreeMap, BTreeSet};

use trainyard::backend::{DriverNote, ExecutorOptions, unique_run_name};
use trainyard::local::WarmPythonSpec;
use trainyard::resources::Resources;
use trainyard::runtime::timings as phase;
use trainyard_config::{CheckpointConfig, FailureConfig, RunConfig, ScalingConfig};

use crate::Failure;
use crate::args::{
    BackendKind, RunArgs, RuntimeKind, master_port_error, reserved_env_error,
    shared_accelerator_error,
};
use crate::values::FlagError;

/// What the flags ask for: a run driven from here, or (`--detach`) one submitted as a Slurm
/// batch job of this scaling config.
pub(super) enum Request {
    Drive(Box<Launch>),
    Detach(ScalingConfig),
}

/// A run to drive: its configuration, and how its runtime starts.
pub(super) struct Launch {
    pub(super) scaling: ScalingConfig,
    pub(super) run: RunConfig,
    pub(super) options: ExecutorOptions,
    pub(super) start: Start,
    /// The ranks whose output the console shows (`--ranks`); all when `None`.
    pub(super) ranks: Option<BTreeSet<u32>>,
    /// What each worker asks for.
    pub(super) worker: Resources,
}

/// The RUN flags, checked together, as what they ask for.
pub(super) fn request(args: &RunArgs) -> Result<Request, Failure> {
    check_runtime_flags(args)?;
    let scaling = args.scaling_config()?;
    let backend = args.backend();
    let reserved = backend.reserved_env();
    let mut run = run_config(args, &reserved)?;
    let worker = scaling.worker_resources().map_err(Failure::bad_input)?;
    if let Some(error) =
        shared_accelerator_error(&run.env, &worker, backend.share_accelerator_ids())
    {
        return Err(Failure::bad_input(error));
    }
    if args.backend == BackendKind::Torch
        && let Some(error) = master_port_error(&run.env)
    {
        return Err(Failure::bad_input(error));
    }
    let ranks = args
        .ranks
        .as_ref()
        .map(|ranks| ranks.within(scaling.num_workers.max()))
        .transpose()
        .map_err(Failure::bad_input)?;
    let words: Vec<String> = std::env::args().collect();
    let options = ExecutorOptions {
        placement_timeout: args
            .placement_timeout
            .unwrap_or(trainyard::backend::DEFAULT_PLACEMENT_TIMEOUT),
        driver: DriverNote {
            command: Some(crate::secrets::recorded(&words, args.program.len())),
            // A `--detach` run's batch script says so: this process is its job's own.
            slurm_job: std::env::var_os(crate::slurm::DETACHED_VAR)
                .and_then(|_| std::env::var(trainyard::slurm::JOB_ID_VAR).ok())
                .filter(|job| !job.is_empty()),
        },
        ..ExecutorOptions::default()
    };
    let name = unique_run_name();
    // Detecting this machine is the first part of reading the cluster.
    let detecting = tracing::info_span!(target: phase::TARGET, phase::CLUSTER).entered();
    let start = match args.runtime {
        RuntimeKind::Local => {
            let mut config = args
                .local
                .config(&name, args.name.as_deref(), args.no_wait)?;
            config.warm_python = warm_python(args)?;
            Start::Local(config)
        }
        RuntimeKind::Ray => {
            for (key, value) in env_from_driver(&args.env_from_driver, &reserved)? {
                run.env.entry(key).or_insert(value);
            }
            let config = args
                .ray
                .config(&name)?
                .wait_for_resources(args.wait_for_resources)
                .warm_python(warm_python(args)?);
            Start::Ray(config)
        }
        RuntimeKind::Slurm => {
            // In a batch job of `--detach`, the run is the submitted one: it runs here.
            let submitted = std::env::var_os(crate::slurm::DETACHED_VAR).is_some()
                && std::env::var_os(trainyard::slurm::JOB_ID_VAR).is_some();
            if args.detach && !submitted {
                return Ok(Request::Detach(scaling));
            }
            // Job steps get the driver's whole environment (srun --export=ALL). The
            // allocation's job is named after the run, as `squeue` shows it.
            let config = args.slurm.config(args.name.as_deref().unwrap_or(&name))?;
            Start::Slurm(config.warm_python(warm_python(args)?))
        }
    };
    drop(detecting);
    if run.name.is_none() {
        run = run.name(name);
    }
    Ok(Request::Drive(Box::new(Launch {
        scaling,
        run,
        options,
        start,
        ranks,
        worker,
    })))
}

/// `--warm-python`'s interpreter: the command's program, found as its agents will find it,
/// which must be a Python.
fn warm_python(args: &RunArgs) -> Result<Option<WarmPythonSpec>, Failure> {
    let Some(modules) = &args.warm_python else {
        return Ok(None);
    };
    let value = modules.0.join(",");
    let refused =
        |reason: String| Failure::bad_input(FlagError::new("--warm-python", &value)(reason.into()));
    let program = args.program.first().map_or("", String::as_str);
    let python = if program.contains('/') {
        std::path::PathBuf::from(program)
    } else {
        which::which(program)
            .map_err(|_| refused(format!("the program `{program}` is not found on PATH")))?
    };
    let name = python.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.starts_with("python") {
        return Err(refused(format!(
            "starts Python programs only, and the program `{program}` is not a Python interpreter (python, python3, python3.11, ...)"
        )));
    }
    // Whether each module's package is installed, without importing it (that is the warm
    // Python's own work, begun as the run starts).
    let packages: Vec<&str> = modules
        .0
        .iter()
        .filter_map(|module| module.split('.').next())
        .collect();
    let found = std::process::Command::new(&python)
        .args(["-c", FIND_PACKAGES])
        .args(&packages)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            refused(format!(
                "the program `{}` cannot be run: {e}",
                python.display()
            ))
        })?;
    let missing = String::from_utf8_lossy(&found.stdout);
    if let Some(package) = missing.split_whitespace().next() {
        return Err(refused(format!(
            "`{package}` is not installed for {} (`{} -m pip install {package}`)",
            python.display(),
            python.display()
        )));
    }
    if !found.status.success() {
        return Err(refused(format!(
            "the program `{}` cannot be run: {}",
            python.display(),
            found.status
        )));
    }
    Ok(Some(WarmPythonSpec {
        python,
        modules: modules.0.clone(),
    }))
}

/// Prints the packages named in `argv` that the interpreter cannot find, as the warm Python
/// looks for them: without the working directory on `sys.path`.
const FIND_PACKAGES: &str = "import importlib.util, sys\ndel sys.path[0]\nfor m in sys.argv[1:]:\n    if importlib.util.find_spec(m) is None: print(m)";

/// The RUN flags turned into the run's configuration; `reserved` are the variables that
/// trainyard sets on every worker, which `--env` cannot set.
fn run_config(
    args: &RunArgs,
    reserved: &BTreeMap<&'static str, &'static str>,
) -> Result<RunConfig, Failure> {
    let mut run = RunConfig::default();
    if let Some(n) = args.max_failures {
        run.failure_config = FailureConfig::from_max_failures(n).map_err(Failure::bad_input)?;
    }
    let mut from_files = Vec::new();
    for file in &args.env_file {
        from_files.extend(crate::values::env_file(file).map_err(Failure::bad_input)?);
    }
    // The files first: `--env` wins.
    for (key, value) in from_files.iter().chain(&args.env) {
        if let Some(error) = reserved_env_error(&format!("{key}={value}"), key, reserved) {
            return Err(Failure::bad_input(error));
        }
        run.env.insert(key.clone(), value.clone());
    }
    run.name.clone_from(&args.name);
    run.storage_path = crate::args::storage_given(args.storage.as_deref());
    if let Some(storage) = &run.storage_path {
        storage
            .parse::<trainyard::checkpoint::StorageLocation>()
            .map_err(|e| Failure::bad_input(FlagError::new("--storage", storage)(e.into())))?;
    }
    run.resume = args.resume;
    run.checkpoint_config = checkpoint_config(args);
    run.hang_timeout = args.hang_timeout;
    run.progress = args.progress;
    run.log_dir = args.log_dir.as_ref().map(|d| d.display().to_string());
    run.tensorboard_dir = args.tensorboard.as_ref().map(|d| d.display().to_string());
    run.mlflow.clone_from(&args.mlflow);
    if let Some(name) = &args.name {
        run.validate()
            .map_err(|e| Failure::bad_input(FlagError::new("--name", name)(e.into())))?;
    }
    run.validate().map_err(Failure::bad_input)?;
    Ok(run)
}

/// `--checkpoints-to-keep`, `--checkpoint-score` and `--max-checkpoint-size`.
fn checkpoint_config(args: &RunArgs) -> CheckpointConfig {
    let mut config = CheckpointConfig::default();
    if let Some(n) = args.checkpoints_to_keep {
        config = config.num_to_keep(n);
    }
    if let Some(score) = &args.checkpoint_score {
        config = config.score(&score.attribute, score.order);
    }
    if let Some(size) = args.max_checkpoint_size {
        let files = config.max_checkpoint_files;
        config = config.max_checkpoint(files, Some(size));
    }
    config
}

/// How the run's runtime is started.
pub(super) enum Start {
    Local(trainyard::local::LocalConfig),
    Ray(trainyard::ray::RayConfig),
    Slurm(trainyard::slurm::SlurmConfig),
}

/// The flags that only one runtime or backend reads, refused with the other.
fn check_runtime_flags(args: &RunArgs) -> Result<(), Failure> {
    let misplaced = |flag: &'static str, value: &str, reason: &str| {
        Err(Failure::bad_input(FlagError::new(flag, value)(
            reason.to_owned().into(),
        )))
    };
    if let (Some(secs), BackendKind::None) = (args.torch_timeout, args.backend) {
        return misplaced(
            "--torch-timeout",
            &secs.to_string(),
            "applies to --backend torch only; --backend none sets up no process group",
        );
    }
    if let Some(n) = args.nproc_per_node {
        let nodes = args.local.nodes.filter(|nodes| *nodes > 1);
        if matches!(args.runtime, RuntimeKind::Ray | RuntimeKind::Slurm) {
            return misplaced(
                "--nproc-per-node",
                &n.to_string(),
                "on --runtime ray and slurm the workers span the cluster's nodes, so there is no count per node: give the total number of workers with -n",
            );
        }
        if let Some(nodes) = nodes {
            return misplaced(
                "--nproc-per-node",
                &n.to_string(),
                &format!(
                    "with --nodes {nodes} the workers span {nodes} virtual nodes, so there is no count per node: give the total number of workers with -n"
                ),
            );
        }
    }
    if args.runtime != RuntimeKind::Slurm {
        if let Some((flag, value)) = args.slurm.given() {
            return misplaced(flag, value, "applies to --runtime slurm only");
        }
    }
    if let (Some(address), RuntimeKind::Local | RuntimeKind::Slurm) =
        (&args.ray.address, args.runtime)
    {
        return misplaced(
            "--address",
            address,
            "--address names a Ray cluster and applies to --runtime ray only",
        );
    }
    match args.runtime {
        RuntimeKind::Local => {
            if args.wait_for_resources {
                return misplaced(
                    "--wait-for-resources",
                    "true",
                    "applies to --runtime ray only; the local runtime waits for other runs unless --no-wait",
                );
            }
        }
        RuntimeKind::Ray => {
            if args.no_wait {
                return misplaced(
                    "--no-wait",
                    "true",
                    "applies to --runtime local only (runs sharing this machine)",
                );
            }
            if let Some(flag) = args.local.given() {
                return misplaced(
                    flag,
                    "(given)",
                    "describes this machine and applies to --runtime local only; a Ray cluster describes itself",
                );
            }
        }
        RuntimeKind::Slurm => {
            for (given, flag, why) in [
                (
                    args.no_wait,
                    "--no-wait",
                    "applies to --runtime local only (runs sharing this machine); Slurm queues the allocation up to --placement-timeout",
                ),
                (
                    args.wait_for_resources,
                    "--wait-for-resources",
                    "applies to --runtime ray only; Slurm queues the allocation up to --placement-timeout",
                ),
            ] {
                if given {
                    return misplaced(flag, "true", why);
                }
            }
            if let Some(flag) = args.local.given() {
                return misplaced(
                    flag,
                    "(given)",
                    "describes this machine and applies to --runtime local only; a Slurm cluster describes itself",
                );
            }
        }
    }
    Ok(())
}

/// The driver's variables that `--env-from-driver` copies to a remote runtime's workers:
/// exact names, or a prefix ending in `*`. A name that trainyard sets on every worker
/// (`reserved`) is refused; a prefix passes over such names.
fn env_from_driver(
    patterns: &[String],
    reserved: &BTreeMap<&'static str, &'static str>,
) -> Result<Vec<(String, String)>, Failure> {
    // Each is a name or a prefix (its parser, `values::env_pattern`, said so).
    for pattern in patterns {
        if let Some(meaning) = reserved.get(pattern.as_str()) {
            return Err(Failure::bad_input(FlagError::new(
                "--env-from-driver",
                pattern,
            )(
                format!("trainyard sets `{pattern}` on every worker ({meaning})").into(),
            )));
        }
    }
    let matches = |name: &str| {
        !reserved.contains_key(name)
            && patterns
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => name == pattern,
                })
    };
    Ok(std::env::vars().filter(|(name, _)| matches(name)).collect())
}
