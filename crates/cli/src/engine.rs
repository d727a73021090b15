//! The runtime a command uses: this machine ([`LocalRuntime`]) or a Ray cluster
//! ([`RayRuntime`]), started from the RAY flags.

use std::sync::Arc;
use tokio::sync::watch;
use trainyard::local::LocalRuntime;
use trainyard::ray::{BridgeError, RayConfig, RayError, RayRuntime};
use trainyard::runtime::{ActorRuntime, ClusterSnapshot, Shortage};

use crate::Failure;
use crate::args::{FlagError, RayArgs};

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
}

impl Engine {
    /// The runtime, for a trainer.
    pub(crate) fn runtime(&self) -> Arc<dyn ActorRuntime> {
        match self {
            Self::Local(local) => Arc::new(local.clone()),
            Self::Ray(ray) => Arc::new(ray.clone()),
        }
    }

    /// Ends every worker, and on Ray the run's actors, groups and bridge.
    pub(crate) async fn shutdown(&self) {
        match self {
            Self::Local(local) => local.shutdown().await,
            Self::Ray(ray) => ray.shutdown().await,
        }
    }

    /// What a waiting placement group lacks while other runs on this machine hold it.
    pub(crate) fn shortages(&self) -> Option<watch::Receiver<Option<Shortage>>> {
        match self {
            Self::Local(local) => Some(local.shortages()),
            Self::Ray(_) => None,
        }
    }
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
    /// flags' fault (exit 2).
    pub(crate) async fn start(&self, config: RayConfig) -> Result<RayRuntime, Failure> {
        let address = self.address().unwrap_or_default();
        RayRuntime::start(config)
            .await
            .map_err(|error| match error {
                RayError::Bridge(
                    error @ (BridgeError::Unreachable { .. } | BridgeError::Auth { .. }),
                ) => Failure::bad_input(FlagError::new("--address", &address)(Box::new(error))),
                error => Failure::other(error),
            })
    }
}
