//! The run's warm Python: one interpreter, started with the run's first agent, that imports
//! the modules it is given once and then starts each Python task of the run's agents as a fork
//! of itself ([`trainyard_wire::warm::WarmZygote`]). It outlives attempts, so a restart does
//! not pay for starting Python and importing them again.

pub use trainyard_wire::config::WarmPythonSpec;
