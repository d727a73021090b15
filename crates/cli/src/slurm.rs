//! `--runtime slurm`: the SLURM flags, starting the Slurm runtime, its node table for
//! `cluster` and `plan`, and `run --detach`, which submits the whole run as a batch job.

use std::path::{Path, PathBuf};

use trainyard::runtime::{ActorRuntime, ClusterSnapshot, RuntimeError};
use trainyard::slurm::request::Shape;
use trainyard::slurm::{AllocationOptions, JOB_ID_VAR, SlurmConfig, SlurmError, SlurmRuntime};
use trainyard_config::ScalingConfig;

use crate::Failure;
use crate::args::SlurmArgs;
use crate::values::FlagError;

/// Set in a `--detach` run's batch script: the run inside it is the submitted one.
pub(crate) const DETACHED_VAR: &str = trainyard::backend::SLURM_DETACHED_VAR;

impl SlurmArgs {
    /// The first SLURM flag given, for refusing it with another runtime.
    pub(crate) fn given(&self) -> Option<(&'static str, &str)> {
        [
            ("--partition", &self.partition),
            ("--account", &self.account),
            ("--qos", &self.qos),
            ("--time", &self.time),
            ("--signal", &self.signal),
        ]
        .into_iter()
        .find_map(|(flag, value)| value.as_deref().map(|value| (flag, value)))
    }

    /// The allocation options of the flags (each checked as it was parsed).
    pub(crate) fn options(&self) -> AllocationOptions {
        AllocationOptions {
            partition: self.partition.clone(),
            account: self.account.clone(),
            qos: self.qos.clone(),
            time: self.time.clone(),
            signal: self.signal.clone(),
        }
    }

    /// The Slurm runtime's configuration for a run named `run_name`: inside `$SLURM_JOB_ID`'s
    /// allocation when it is set, else with an allocation of its own.
    pub(crate) fn config(&self, run_name: &str) -> Result<SlurmConfig, Failure> {
        let options = self.options();
        let config = SlurmConfig::new(run_name).map_err(Failure::other)?;
        // A `--detach` run's batch job was requested with the flags already.
        let submitted = std::env::var_os(DETACHED_VAR).is_some();
        if let (Some(job), Some((flag, value)), false) = (&config.job, self.given(), submitted) {
            return Err(Failure::bad_input(FlagError::new(flag, value)(
                format!(
                    "this runs inside Slurm job {job} (${JOB_ID_VAR}), whose allocation is used as it is; the flag applies to an allocation of the run's own"
                )
                .into(),
            )));
        }
        Ok(config.allocation(options))
    }

    /// Starts the Slurm runtime; a cluster without Slurm, or a partition it does not have,
    /// is the flags' fault (exit 2).
    pub(crate) async fn start(&self, config: SlurmConfig) -> Result<SlurmRuntime, Failure> {
        SlurmRuntime::start(config)
            .await
            .map_err(|error| self.failure(error))
    }

    /// A Slurm error as the command's failure.
    pub(crate) fn failure(&self, error: SlurmError) -> Failure {
        match error {
            error @ SlurmError::Missing { .. } => {
                Failure::bad_input(FlagError::new("--runtime", "slurm")(Box::new(error)))
            }
            error @ SlurmError::NoPartition { .. } => {
                Failure::bad_input(FlagError::new(
                    "--partition",
                    self.partition.as_deref().unwrap_or("(default)"),
                )(Box::new(error)))
            }
            error => Failure::other(error),
        }
    }

    /// The partition's nodes (or the allocation's) as they are now.
    pub(crate) fn snapshot(&self) -> Result<ClusterSnapshot, Failure> {
        let config = self.config(&trainyard::backend::unique_run_name())?;
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Failure::other)?;
        tokio.block_on(async {
            let slurm = self.start(config).await?;
            let snapshot = slurm.cluster().await;
            slurm.shutdown().await;
            snapshot.map_err(Failure::other)
        })
    }
}

/// `run --detach`: checks that some set of the partition's nodes can hold the run (exit 3
/// at once when none can), then submits a batch job shaped like the allocation the run
/// would request, whose script is this very command line (run inside the allocation), and
/// prints its job id and output file.
pub(crate) fn detach(
    args: &SlurmArgs,
    scaling: &ScalingConfig,
    name: Option<&str>,
    output: Option<&Path>,
    program: usize,
) -> Result<(), Failure> {
    let options = args.options();
    let factory = scaling
        .placement_group_factory()
        .map_err(Failure::bad_input)?;
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::other)?;
    let nodes = tokio
        .block_on(trainyard::slurm::slurm::partition_nodes(
            options.partition.as_deref(),
        ))
        .map_err(|error| args.failure(error))?
        .1;
    let totals: Vec<_> = nodes
        .iter()
        .map(trainyard::slurm::slurm::SlurmNode::total)
        .collect();
    let shape = Shape::for_group(&factory, &totals).map_err(|error| {
        Failure::new(
            crate::EXIT_UNSCHEDULABLE,
            trainyard::backend::ExecutorError::Unschedulable(Box::new(RuntimeError::Infeasible(
                error,
            ))),
        )
    })?;
    let exe = std::env::current_exe().map_err(Failure::other)?;
    // The secrets go to the job in its environment (sbatch passes its own on), not in its
    // script.
    let run_name = name.map_or_else(trainyard::backend::unique_run_name, str::to_owned);
    let mut words: Vec<std::ffi::OsString> = std::iter::once(exe.into_os_string())
        .chain(std::env::args_os().skip(1))
        .collect();
    // The run inside has the job's name (`run` is the first word after the binary), so that
    // `trainyard stop` can tell the job is the run's.
    if name.is_none() {
        words.splice(2..2, ["--name".into(), run_name.clone().into()]);
    }
    let (words, secrets) = crate::secrets::passed_on(&words, program);
    let mut script = format!("export {DETACHED_VAR}=1; exec");
    for word in words {
        script.push(' ');
        script.push_str(&shell_quoted(&word.to_string_lossy()));
    }
    let output = output.map_or_else(|| PathBuf::from("trainyard-%j.out"), Path::to_path_buf);
    let output = std::path::absolute(&output).unwrap_or(output);
    let mut sbatch = vec![
        "--parsable".to_owned(),
        format!("--job-name={run_name}"),
        format!("--output={}", output.display()),
    ];
    sbatch.extend(shape.flags());
    sbatch.extend(options.flags());
    sbatch.push(format!("--wrap={script}"));
    let sbatch: Vec<&str> = sbatch.iter().map(String::as_str).collect();
    let submitted = tokio.block_on(trainyard::slurm::slurm::output_with_env(
        "sbatch", &sbatch, &secrets,
    ));
    let job = match submitted {
        Ok(out) => out.trim().split(';').next().unwrap_or_default().to_owned(),
        Err(SlurmError::Command { message, .. }) => return Err(refused(args, &message)),
        Err(error) => return Err(args.failure(error)),
    };
    let file = output.to_string_lossy().replace("%j", &job);
    println!("{job}");
    eprintln!("trainyard: submitted Slurm job {job}; its output goes to {file}");
    Ok(())
}

/// Slurm's refusal of a submission: a flag naming what Slurm does not have (an account, a
/// QOS, a partition) is bad input (exit 2); anything else cannot be scheduled (exit 3).
fn refused(args: &SlurmArgs, said: &str) -> Failure {
    let said = said.trim();
    let lower = said.to_ascii_lowercase();
    for (word, flag, value) in [
        ("account", "--account", &args.account),
        ("qos", "--qos", &args.qos),
        ("partition", "--partition", &args.partition),
    ] {
        if lower.contains("invalid") && lower.contains(word) {
            if let Some(value) = value {
                return Failure::bad_input(FlagError::new(flag, value)(
                    format!("Slurm refused it: {said}").into(),
                ));
            }
        }
    }
    Failure::new(
        crate::EXIT_UNSCHEDULABLE,
        trainyard::backend::ExecutorError::Unschedulable(Box::new(RuntimeError::Refused {
            scheduler: "Slurm",
            reason: said.to_owned(),
        })),
    )
}

/// `word` as one word for `sh`.
fn shell_quoted(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
    {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_batch_script_only_when_needed() {
        assert_eq!(shell_quoted("-n"), "-n");
        assert_eq!(shell_quoted("{\"CPU\":1}"), "'{\"CPU\":1}'");
        assert_eq!(shell_quoted("it's"), "'it'\\''s'");
        assert_eq!(shell_quoted(""), "''");
        assert_eq!(shell_quoted("a b"), "'a b'");
    }
}
