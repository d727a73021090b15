//! Links the `trainyard` binary at a fixed address on Linux (`-no-pie`).
//!
//! Every worker's agent is this same binary, started once per worker. Position-independent,
//! each start relocates about 35 000 pointers, and the kernel copies the 1.2 MiB of tables
//! they sit in for each process; at a fixed address there is nothing to relocate and the
//! tables stay shared. That is about 0.4 ms of each agent's start and of its exit on a
//! 2-core machine (`cargo xtask bench-e2e`, 64 workers). `TRAINYARD_LINK_PIE=1` at build time
//! keeps the binary position-independent, for address-space randomisation of its own code.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TRAINYARD_LINK_PIE");
    let target = |key: &str| std::env::var(key).unwrap_or_default();
    let linux_gnu =
        target("CARGO_CFG_TARGET_OS") == "linux" && target("CARGO_CFG_TARGET_ENV") == "gnu";
    let pie = std::env::var_os("TRAINYARD_LINK_PIE").is_some_and(|v| !v.is_empty() && v != "0");
    if linux_gnu && !pie {
        println!("cargo:rustc-link-arg-bin=trainyard=-no-pie");
    }
}
