//! The runtime a command uses: this machine ([`LocalRuntime`]), a Ray cluster
//! ([`RayRuntime`]), started from the RAY flags, or a Slurm cluster ([`SlurmRuntime`]).

use std::sync::Arc;
use tokio::sync::watch;
use trainyard::local::LocalRuntime;
use trainyard::ray::{BridgeError, RayConfig, RayError, RayRuntime};
use trainyard::runtime::{ActorRuntime, ClusterSnapshot};
use trainyard::slurm::SlurmRuntime;

use crate::Failure;
use crate::args::RayArgs;
use crate::values::FlagError;

/// The variable Ray's own tools read for the cluster's address.
const RAY_ADDRESS: &str = "RAY_ADDRESS";

/// The Ray cluster at `--address` (or `$RAY_ADDRESS`) as it is now.
pub(crate) fn ray_snapshot(args: &RayArgs) -> Result<ClusterSnapshot, Failure> {
    if args.address().is_none() {
        return Err(Failure::bad_input(
            "--runtime ray needs the cluster's address here: --address HOST:PORT or $RAY_ADDRESS",
        ));
    }
    let config = args.config(&trainyard::backend::unique_run_name())?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Failure::other)?;
    tokio.block_on(async {
        let ray = args.start(config).await?;
        let snapshot = ray.cluster().await;
        ray.shutdown().await;
        snapshot.map_err(Failure::other)
    })
}

/// A started runtime.
#[derive(Debug, Clone)]
pub(crate) enum Engine {
    /// This machine.
    Local(LocalRuntime),
    /// A Ray cluster.
    Ray(RayRuntime),
    /// A Slurm cluster.
    Slurm(SlurmRuntime),
}

impl Engine {
    /// The runtime, for a trainer.
    pub(crate) fn runtime(&self) -> Arc<dyn ActorRuntime> {
        match self {
            Self::Local(local) => Arc::new(local.clone()),
            Self::Ray(ray) => Arc::new(ray.clone()),
            Self::Slurm(slurm) => Arc::new(slurm.clone()),
        }
    }

    /// Ends every worker, and on Ray the run's actors, groups and bridge, on Slurm the
    /// run's allocation.
    pub(crate) async fn shutdown(&self) {
        match self {
            Self::Local(local) => local.shutdown().await,
            Self::Ray(ray) => ray.shutdown().await,
            Self::Slurm(slurm) => slurm.shutdown().await,
        }
    }

    /// What a waiting placement group waits for, as a progress line: what other runs on
    /// this machine hold, or the Slurm job that is pending and why.
    pub(crate) fn waits(&self) -> Option<watch::Receiver<Option<String>>> {
        match self {
            Self::Local(local) => Some(said(local.placer().shortages(), |shortage| {
                format!("waiting for other runs on this machine: {shortage}")
            })),
            Self::Ray(_) => None,
            Self::Slurm(slurm) => Some(said(slurm.placer().queued(), |queued| {
                format!("waiting for Slurm to grant the allocation: {queued}")
            })),
        }
    }
}

/// What `states` holds, as the progress lines `say` makes of it, as it changes.
fn said<T: Send + Sync + 'static>(
    mut states: watch::Receiver<Option<T>>,
    say: impl Fn(&T) -> String + Send + 'static,
) -> watch::Receiver<Option<String>> {
    let (lines, out) = watch::channel(states.borrow_and_update().as_ref().map(&say));
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let line = states.borrow_and_update().as_ref().map(&say);
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    out
}

impl RayArgs {
    /// The cluster's address: `--address`, else `$RAY_ADDRESS`; `None` starts a throwaway
    /// head for the run.
    pub(crate) fn address(&self) -> Option<String> {
        self.address
            .clone()
            .or_else(|| std::env::var(RAY_ADDRESS).ok())
            .filter(|address| !address.trim().is_empty())
    }

    /// The Ray runtime's configuration for a run named `run_name`.
    pub(crate) fn config(&self, run_name: &str) -> Result<RayConfig, Failure> {
        let mut config = RayConfig::new(run_name).map_err(Failure::other)?;
        if let Some(address) = self.address() {
            if address.trim() != address || address.contains(char::is_whitespace) {
                return Err(Failure::bad_input(FlagError::new("--address", &address)(
                    "expected HOST:PORT of the Ray head's GCS, such as 10.0.0.1:6379".into(),
                )));
            }
            config = config.address(address);
        }
        Ok(config)
    }

    /// Starts the Ray runtime; a cluster that does not answer, or refuses the token, is the
    /// flags' fault (exit 2), and so is an interpreter without Ray or with another release.
    pub(crate) async fn start(&self, config: RayConfig) -> Result<RayRuntime, Failure> {
        let address = self.address().unwrap_or_default();
        RayRuntime::start(config)
            .await
            .map_err(|error| match error {
                RayError::Bridge(
                    error @ (BridgeError::Unreachable { .. } | BridgeError::Auth { .. }),
                ) => Failure::bad_input(FlagError::new("--address", &address)(Box::new(error))),
                RayError::Bridge(
                    error @ (BridgeError::NoRay { .. } | BridgeError::RayVersion { .. }),
                ) => Failure::bad_input(error),
                error => Failure::other(error),
            })
    }
}
