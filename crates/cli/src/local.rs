//! The LOCAL flags turned into the local runtime's nodes.

use crate::Failure;
use crate::args::{LocalArgs, warn_case_mistakes};
use crate::values::FlagError;
use trainyard::local::detect::{Machine, Overrides, plan_nodes};
use trainyard::local::{LocalConfig, LocalNode, WhenBusy};

impl LocalArgs {
    /// The first LOCAL flag given, if any (they describe this machine only).
    pub(crate) fn given(&self) -> Option<&'static str> {
        [
            (self.num_cpus.is_some(), "--num-cpus"),
            (self.num_gpus.is_some(), "--num-gpus"),
            (self.memory.is_some(), "--memory"),
            (self.resources.is_some(), "--resources"),
            (self.nodes.is_some(), "--nodes"),
            (self.enforce_memory, "--enforce-memory"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// What the user set on the command line, checked.
    fn overrides(&self) -> Result<Overrides, Failure> {
        let num_gpus = self
            .num_gpus
            .map(|gpus| {
                u32::try_from(gpus).map_err(|e| {
                    Failure::bad_input(FlagError::new("--num-gpus", &gpus.to_string())(
                        format!("must be a whole number from 0 to {} ({e})", u32::MAX).into(),
                    ))
                })
            })
            .transpose()?;
        Ok(Overrides {
            num_cpus: self.num_cpus,
            num_gpus,
            memory: self.memory.map(|size| size.bytes()),
            resources: self.resources.clone().unwrap_or_default(),
        })
    }

    /// The number of virtual nodes.
    fn node_count(&self) -> Result<u32, Failure> {
        let nodes = self.nodes.unwrap_or(1);
        u32::try_from(nodes)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                Failure::bad_input(FlagError::new("--nodes", &nodes.to_string())(
                    "must be a whole number of at least 1".into(),
                ))
            })
    }

    /// This machine as the flags describe it, split into its virtual nodes.
    pub(crate) fn nodes(&self) -> Result<Vec<LocalNode>, Failure> {
        let overrides = self.overrides()?;
        let count = self.node_count()?;
        let machine = Machine::detect();
        let nodes = plan_nodes(&machine, &overrides, count).map_err(Failure::bad_input)?;
        warn_case_mistakes([&overrides.resources]);
        Ok(nodes)
    }

    /// The local runtime's configuration for a run named `run_name` (unique to this driver),
    /// which other runs see as `label` (its `--name`) when it has one; `no_wait` fails the
    /// run at once when other runs hold what it needs.
    pub(crate) fn config(
        &self,
        run_name: &str,
        label: Option<&str>,
        no_wait: bool,
    ) -> Result<LocalConfig, Failure> {
        let nodes = self.nodes()?;
        let mut config = LocalConfig::new(nodes, run_name).map_err(Failure::other)?;
        config.enforce_memory = self.enforce_memory;
        config.label = label.map(str::to_owned);
        config.when_busy = if no_wait {
            WhenBusy::Fail
        } else {
            WhenBusy::Wait
        };
        Ok(config)
    }
}
