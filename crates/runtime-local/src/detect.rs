//! What this machine offers to workers, the user's overrides, and the split of the machine
//! into virtual nodes.
//!
//! [`Machine::detect`] reads the CPUs, memory and GPUs a worker may use: the affinity mask
//! bounded by the cgroup CPU quota (kept exact when fractional), `MemTotal` bounded by the
//! cgroup memory limit, and `CUDA_VISIBLE_DEVICES` or else `nvidia-smi`. [`plan_nodes`]
//! applies the command-line [`Overrides`] and deals the machine out to `--nodes`
//! [`LocalNode`]s. Every parser is a pure function over text and the split is a pure function
//! over plain data; only a thin layer reads files and runs commands.
//!
//! ```
//! use trainyard_resources::{CPU, MEMORY, ResourceAmount};
//! use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
//!
//! let machine = Machine {
//!     hostname: "box".into(),
//!     cpus: "1.5".parse()?,
//!     memory: 1000,
//!     gpus: Vec::new(),
//! };
//! let overrides = Overrides { num_gpus: Some(2), ..Overrides::default() };
//! let nodes = plan_nodes(&machine, &overrides, 2)?;
//! assert_eq!(nodes[1].id.as_str(), "local-1");
//! assert_eq!(nodes[1].resources.amount(CPU), "0.75".parse()?);
//! assert_eq!(nodes[1].resources.amount(MEMORY), ResourceAmount::from(500u32));
//! assert_eq!(nodes[1].gpu_ids, ["1"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsStr;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use trainyard_agent::cgroup::{CgroupLookupError, CgroupMount, CgroupQuery, Hierarchy, own_cgroup};
use trainyard_resources::{CPU, GPU, MEMORY, ResourceAmount, Resources, STEPS_PER_UNIT};
use trainyard_runtime::NodeId;

/// The most virtual nodes [`plan_nodes`] makes.
pub const MAX_NODES: u32 = 1024;

/// The most GPUs `--num-gpus` may ask for (real or made up).
pub const MAX_GPUS: u32 = 4096;

/// How long `nvidia-smi` may run before it is killed and the machine is taken to have no GPU.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a running `nvidia-smi` is checked for exit.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// cgroup v1 reports "no memory limit" as a page-rounded `i64::MAX`
/// (9223372036854771712); anything this large means unlimited.
const V1_UNLIMITED_MEMORY: u64 = 1 << 62;

/// One GPU of this machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gpu {
    /// What a worker's `CUDA_VISIBLE_DEVICES` names it by: an index (`0`), a `GPU-<uuid>` or
    /// a `MIG-<uuid>`. GPUs found by `nvidia-smi` are named by UUID, which unlike an index
    /// does not depend on `CUDA_DEVICE_ORDER`.
    pub id: String,
    /// The product name (`NVIDIA H200`), when known.
    pub name: Option<String>,
    /// Total memory in bytes, when known.
    pub memory: Option<u64>,
}

/// What this machine offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The host name; `localhost` when it cannot be read.
    pub hostname: String,
    /// Usable CPUs: the affinity mask bounded by the cgroup CPU quota, which may be fractional.
    pub cpus: ResourceAmount,
    /// Usable memory in bytes: `MemTotal` bounded by the cgroup memory limit.
    pub memory: u64,
    /// The GPUs workers may use, in the order they are handed out.
    pub gpus: Vec<Gpu>,
}

impl Machine {
    /// Detects what this machine offers. Never fails: what cannot be read falls back (to
    /// `available_parallelism`, to no cgroup limit, to no GPU) and is logged.
    ///
    /// Call it before pinning the calling thread, whose affinity mask bounds the CPU count.
    /// It blocks while `nvidia-smi` runs (a few seconds at most); from async code call it
    /// inside `spawn_blocking`.
    #[must_use]
    pub fn detect() -> Self {
        Self {
            hostname: detect_hostname(),
            cpus: detect_cpus(),
            memory: detect_memory(),
            gpus: detect_gpus(),
        }
    }
}

/// What the user set on the command line (`--num-cpus`, `--num-gpus`, `--memory`,
/// `--resources`); each set field replaces what was detected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--num-cpus`: the CPUs of the whole machine.
    pub num_cpus: Option<ResourceAmount>,
    /// `--num-gpus`: the first N detected GPUs; when fewer were detected, the missing ones are
    /// made up with the next unused indexes (`0`, `1`, ...), so GPUs can be faked.
    pub num_gpus: Option<u32>,
    /// `--memory`: the bytes of the whole machine.
    pub memory: Option<u64>,
    /// `--resources`: custom resources of the whole machine; `CPU`, `GPU` and `memory` have
    /// their own options and are refused here.
    pub resources: Resources,
}

/// One (virtual) node of the local runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalNode {
    /// `local-0`, `local-1`, ...
    pub id: NodeId,
    /// What the node offers: `CPU`, `memory` (bytes), `GPU` (a count) and custom resources.
    /// A resource the node has none of is absent, never zero.
    pub resources: Resources,
    /// The `CUDA_VISIBLE_DEVICES` entries of the node's GPUs, as many as its `GPU` amount.
    pub gpu_ids: Vec<String>,
}

/// Why the machine cannot be split into nodes as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DetectError {
    /// `--nodes` is zero or above [`MAX_NODES`].
    #[error("--nodes must be between 1 and {max}, got {nodes}", max = MAX_NODES)]
    NodeCount {
        /// The number of nodes asked for.
        nodes: u32,
    },
    /// `--num-gpus` is above [`MAX_GPUS`].
    #[error("--num-gpus must be at most {max}, got {gpus}", max = MAX_GPUS)]
    GpuCount {
        /// The number of GPUs asked for.
        gpus: u32,
    },
    /// `--resources` names a resource that has its own option.
    #[error("resource `{name}` cannot be set with --resources, use {option} instead")]
    ReservedInResources {
        /// The resource named.
        name: String,
        /// The option to use instead (`--num-cpus`, `--num-gpus` or `--memory`).
        option: &'static str,
    },
}

/// Splits the machine, with the user's overrides applied, into `nodes` virtual nodes.
///
/// Whole CPUs are dealt out as evenly as possible, the first nodes getting the remainder and
/// the first node with the fewest getting any fractional part; when there are fewer whole
/// CPUs than nodes, the total is divided exactly in 0.0001 steps. Custom resources split the
/// same way, memory bytes evenly (remainder bytes to the first nodes), and GPUs as contiguous
/// runs of ids (node 0 gets the first ones). The pieces always add up to the total.
///
/// # Errors
/// [`DetectError::NodeCount`] unless `1 <= nodes <= MAX_NODES`;
/// [`DetectError::GpuCount`] when `--num-gpus` is above [`MAX_GPUS`];
/// [`DetectError::ReservedInResources`] when `--resources` holds `CPU`, `GPU` or `memory`.
pub fn plan_nodes(
    machine: &Machine,
    overrides: &Overrides,
    nodes: u32,
) -> Result<Vec<LocalNode>, DetectError> {
    if nodes == 0 || nodes > MAX_NODES {
        return Err(DetectError::NodeCount { nodes });
    }
    check_custom_resources(&overrides.resources)?;
    let gpu_ids = chosen_gpu_ids(&machine.gpus, overrides.num_gpus)?;
    let cpus = overrides.num_cpus.unwrap_or(machine.cpus);
    let memory = overrides.memory.unwrap_or(machine.memory);

    let count = usize::try_from(nodes).unwrap_or(usize::MAX);
    let mut planned = vec![Resources::new(); count];
    deal(&mut planned, CPU, split_amount(cpus, nodes));
    deal(
        &mut planned,
        MEMORY,
        even_shares(u128::from(memory), nodes).map(units),
    );
    for (name, total) in overrides.resources.iter() {
        deal(&mut planned, name, split_amount(total, nodes));
    }

    let mut rest = gpu_ids.as_slice();
    let gpu_counts = even_shares(gpu_ids.len() as u128, nodes);
    Ok(planned
        .into_iter()
        .zip(gpu_counts)
        .enumerate()
        .map(|(index, (mut resources, gpus))| {
            let gpus = usize::try_from(gpus).unwrap_or(usize::MAX);
            // The counts add up to `gpu_ids.len()`, so the split always fits.
            let (mine, others) = rest.split_at_checked(gpus).unwrap_or((rest, &[]));
            rest = others;
            if !mine.is_empty() {
                resources.insert(GPU, units(mine.len() as u128));
            }
            LocalNode {
                id: NodeId(format!("local-{index}")),
                resources,
                gpu_ids: mine.to_vec(),
            }
        })
        .collect())
}

fn check_custom_resources(resources: &Resources) -> Result<(), DetectError> {
    for name in resources.names() {
        let option = match name {
            CPU => "--num-cpus",
            GPU => "--num-gpus",
            MEMORY => "--memory",
            _ => continue,
        };
        return Err(DetectError::ReservedInResources {
            name: name.to_owned(),
            option,
        });
    }
    Ok(())
}

/// The GPU ids to hand out: all detected ones, or the first `wanted`, padded with the lowest
/// indexes not already used.
fn chosen_gpu_ids(gpus: &[Gpu], wanted: Option<u32>) -> Result<Vec<String>, DetectError> {
    let detected = gpus.iter().map(|gpu| gpu.id.clone());
    let Some(wanted) = wanted else {
        return Ok(detected.collect());
    };
    if wanted > MAX_GPUS {
        return Err(DetectError::GpuCount { gpus: wanted });
    }
    let made_up = (0u32..)
        .map(|index| index.to_string())
        .filter(|id| !gpus.iter().any(|gpu| &gpu.id == id));
    let wanted = usize::try_from(wanted).unwrap_or(usize::MAX);
    Ok(detected.chain(made_up).take(wanted).collect())
}

/// Adds each node's share of `name`, leaving out zero shares.
fn deal(planned: &mut [Resources], name: &str, shares: impl Iterator<Item = ResourceAmount>) {
    for (resources, share) in planned.iter_mut().zip(shares) {
        if !share.is_zero() {
            resources.insert(name, share);
        }
    }
}

/// `n` whole units.
fn units(n: u128) -> ResourceAmount {
    ResourceAmount::from_steps(n.saturating_mul(STEPS_PER_UNIT))
}

/// `total` split into `parts` whole numbers that differ by at most one, larger ones first.
fn even_shares(total: u128, parts: u32) -> impl Iterator<Item = u128> {
    let parts = u128::from(parts.max(1));
    let (base, remainder) = (total / parts, total % parts);
    (0..parts).map(move |i| base + u128::from(i < remainder))
}

/// `total` split into `parts` amounts that add up to `total`: whole units dealt out when
/// there are at least as many as parts (the fractional rest going to the first part with
/// the fewest), exact 0.0001 steps otherwise.
fn split_amount(total: ResourceAmount, parts: u32) -> impl Iterator<Item = ResourceAmount> {
    let whole = total.whole_units();
    let shares: Vec<ResourceAmount> = if whole >= u128::from(parts) {
        let fraction = total.steps() % STEPS_PER_UNIT;
        let first_of_fewest = whole % u128::from(parts.max(1));
        even_shares(whole, parts)
            .zip(0u128..)
            .map(|(n, i)| {
                let extra = if i == first_of_fewest { fraction } else { 0 };
                ResourceAmount::from_steps(n * STEPS_PER_UNIT + extra)
            })
            .collect()
    } else {
        even_shares(total.steps(), parts)
            .map(ResourceAmount::from_steps)
            .collect()
    };
    shares.into_iter()
}

// ---------------------------------------------------------------------------------------
// Parsers: pure functions over text, never panicking.
// ---------------------------------------------------------------------------------------

/// A limit read from a cgroup file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit<T> {
    /// No limit at this level.
    Unlimited,
    /// At most this much.
    At(T),
}

impl<T> Limit<T> {
    fn value(self) -> Option<T> {
        match self {
            Self::Unlimited => None,
            Self::At(value) => Some(value),
        }
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn parse_meminfo(text: &str) -> Option<u64> {
    let rest = text
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?;
    let mut words = rest.split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match (words.next(), words.next()) {
        (Some("kB"), None) => value.checked_mul(1024),
        (None, None) => Some(value),
        _ => None,
    }
}

/// CPUs allowed by `quota` µs of CPU time every `period` µs, rounded down to 0.0001 but
/// never zero; `None` for a zero quota or period.
fn quota_amount(quota: u64, period: u64) -> Option<ResourceAmount> {
    if quota == 0 || period == 0 {
        return None;
    }
    let steps = u128::from(quota) * STEPS_PER_UNIT / u128::from(period);
    Some(ResourceAmount::from_steps(steps.max(1)))
}

/// cgroup v2 `cpu.max`: `max 100000` or `150000 100000` (the period defaults to 100000).
fn parse_cpu_max(text: &str) -> Option<Limit<ResourceAmount>> {
    let mut words = text.split_whitespace();
    let quota = words.next()?;
    let period = match words.next() {
        Some(period) => period.parse().ok()?,
        None => 100_000,
    };
    if words.next().is_some() {
        return None;
    }
    if quota == "max" {
        return Some(Limit::Unlimited);
    }
    quota_amount(quota.parse().ok()?, period).map(Limit::At)
}

/// cgroup v1 `cpu.cfs_quota_us` (`-1` for none) and `cpu.cfs_period_us`.
fn parse_v1_quota(quota: &str, period: &str) -> Option<Limit<ResourceAmount>> {
    let quota: i64 = quota.trim().parse().ok()?;
    let Ok(quota) = u64::try_from(quota) else {
        return Some(Limit::Unlimited);
    };
    quota_amount(quota, period.trim().parse().ok()?).map(Limit::At)
}

/// A cgroup v1 memory limit in bytes, where huge values (the sentinel
/// 9223372036854771712) and `-1` mean unlimited.
fn v1_memory_limit(value: &str) -> Option<Limit<u64>> {
    let value = value.trim();
    if value == "-1" {
        return Some(Limit::Unlimited);
    }
    let bytes: u64 = value.parse().ok()?;
    Some(if bytes >= V1_UNLIMITED_MEMORY {
        Limit::Unlimited
    } else {
        Limit::At(bytes)
    })
}

/// cgroup v1 `memory.limit_in_bytes`.
fn parse_v1_memory_limit(text: &str) -> Option<Limit<u64>> {
    v1_memory_limit(text)
}

/// The `hierarchical_memory_limit` line of cgroup v1 `memory.stat`, which includes the limits
/// of ancestors.
fn parse_v1_memory_stat(text: &str) -> Option<Limit<u64>> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == "hierarchical_memory_limit")
            .then(|| words.next())
            .flatten()
            .and_then(v1_memory_limit)
    })
}

/// cgroup v2 `memory.max`: bytes or `max`.
fn parse_v2_memory_max(text: &str) -> Option<Limit<u64>> {
    match text.trim() {
        "max" => Some(Limit::Unlimited),
        bytes => bytes.parse().ok().map(Limit::At),
    }
}

/// One GPU as `nvidia-smi` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SmiGpu {
    index: u32,
    uuid: Option<String>,
    name: Option<String>,
    /// Bytes.
    memory: Option<u64>,
}

impl SmiGpu {
    fn into_gpu(self) -> Gpu {
        Gpu {
            id: self.uuid.unwrap_or_else(|| self.index.to_string()),
            name: self.name,
            memory: self.memory,
        }
    }
}

/// `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`
/// (memory in MiB); lines that do not fit are skipped.
fn parse_nvidia_smi(text: &str) -> Vec<SmiGpu> {
    let known = |value: &str| !value.is_empty() && !value.starts_with('[');
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, uuid, name, memory] = fields.as_slice() else {
                return None;
            };
            Some(SmiGpu {
                index: index.parse().ok()?,
                uuid: (uuid.starts_with("GPU-") || uuid.starts_with("MIG-"))
                    .then(|| (*uuid).to_owned()),
                name: known(name).then(|| (*name).to_owned()),
                memory: memory
                    .parse::<u64>()
                    .ok()
                    .and_then(|mib| mib.checked_mul(1 << 20)),
            })
        })
        .collect()
}

/// The devices of `CUDA_VISIBLE_DEVICES`, read as CUDA does: entries up to the first that is
/// not an index, `GPU-<uuid>` or `MIG-<uuid>`, so `""`, `-1` and `NoDevFiles` mean none.
/// A repeated entry is kept once.
fn parse_cuda_visible_devices(text: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for entry in text.split(',').map(str::trim) {
        let index = !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit());
        let uuid = entry.len() > 4 && (entry.starts_with("GPU-") || entry.starts_with("MIG-"));
        if !index && !uuid {
            break;
        }
        if !ids.iter().any(|id| id == entry) {
            ids.push(entry.to_owned());
        }
    }
    ids
}

// ---------------------------------------------------------------------------------------
// Combining what was read: pure over text and a file reader.
// ---------------------------------------------------------------------------------------

/// Reads a file's text; `None` when it cannot be read (often normal: no such controller).
type Reader<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// The directories of a cgroup hierarchy that bound this process for one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupDirs {
    version: Hierarchy,
    /// The process's own cgroup first, then its ancestors up to the mount point.
    dirs: Vec<PathBuf>,
}

/// Where `controller`'s limits are: the v1 hierarchy holding it if there is one (hybrid
/// hosts also list an empty `0::` line), else the v2 unified hierarchy. The directory is
/// the one [`own_cgroup`] finds, as for the enforcement of memory limits.
fn locate_cgroup(controller: &str, proc_cgroup: &str, mountinfo: &str) -> Option<CgroupDirs> {
    let found = |query| match own_cgroup(query, proc_cgroup, mountinfo) {
        Ok(own) => Ok((own.mount, own.path)),
        // Under a cgroup namespace the path leaves the mounted root; the mount point then
        // holds this process's own limits.
        Err(CgroupLookupError::OutsideMounts { path, mount }) => Ok((*mount, path)),
        Err(other) => Err(Box::new(other)),
    };
    let (mount, path) = found(CgroupQuery::V1(controller))
        .or_else(|v1| found(CgroupQuery::V2).map_err(|v2| (v1, v2)))
        .inspect_err(|(v1, v2)| {
            tracing::debug!(controller, %v1, %v2, "no cgroup bounds this controller");
        })
        .ok()?;
    Some(CgroupDirs {
        version: mount.hierarchy,
        dirs: dirs_up(&mount, &path),
    })
}

/// The cgroup's directory under the mount point, then each parent up to the mount point.
/// A path outside the mounted root (`/../..` under a cgroup namespace) gives the mount point
/// only.
fn dirs_up(mount: &CgroupMount, path: &str) -> Vec<PathBuf> {
    let components: Vec<&OsStr> = match Path::new(path).strip_prefix(&mount.root) {
        Ok(relative)
            if relative
                .components()
                .all(|c| matches!(c, Component::Normal(_))) =>
        {
            relative.components().map(Component::as_os_str).collect()
        }
        _ => Vec::new(),
    };
    (0..=components.len())
        .rev()
        .map(|depth| {
            let mut dir = mount.mount_point.clone();
            dir.extend(components.iter().take(depth));
            dir
        })
        .collect()
}

/// The limit in `path`, if the file exists and sets one.
fn read_limit<T>(path: &Path, read: Reader<'_>, parse: fn(&str) -> Option<Limit<T>>) -> Option<T> {
    let text = read(path)?;
    parse(&text)
        .or_else(|| {
            tracing::warn!(path = %path.display(), "ignoring a cgroup file that cannot be parsed");
            None
        })?
        .value()
}

/// The smallest CPU quota of the cgroup and its ancestors.
fn cgroup_cpu_quota(cgroup: &CgroupDirs, read: Reader<'_>) -> Option<ResourceAmount> {
    cgroup
        .dirs
        .iter()
        .filter_map(|dir| match cgroup.version {
            Hierarchy::V2 => read_limit(&dir.join("cpu.max"), read, parse_cpu_max),
            Hierarchy::V1 => {
                let quota = read(&dir.join("cpu.cfs_quota_us"))?;
                let period = read(&dir.join("cpu.cfs_period_us"))?;
                parse_v1_quota(&quota, &period)
                    .or_else(|| {
                        tracing::warn!(
                            dir = %dir.display(),
                            "ignoring a cgroup v1 CPU quota that cannot be parsed"
                        );
                        None
                    })?
                    .value()
            }
        })
        .min()
}

/// The smallest memory limit of the cgroup and its ancestors, in bytes.
fn cgroup_memory_limit(cgroup: &CgroupDirs, read: Reader<'_>) -> Option<u64> {
    let own_levels = cgroup.dirs.iter().filter_map(|dir| match cgroup.version {
        Hierarchy::V2 => read_limit(&dir.join("memory.max"), read, parse_v2_memory_max),
        Hierarchy::V1 => read_limit(
            &dir.join("memory.limit_in_bytes"),
            read,
            parse_v1_memory_limit,
        ),
    });
    let hierarchical = match (cgroup.version, cgroup.dirs.first()) {
        (Hierarchy::V1, Some(own)) => {
            read_limit(&own.join("memory.stat"), read, parse_v1_memory_stat)
        }
        _ => None,
    };
    own_levels.chain(hierarchical).min()
}

/// The GPUs to offer: `CUDA_VISIBLE_DEVICES` when set (described by `query` where it can
/// be matched), else what `query` finds.
fn resolve_gpus(
    visible: Option<&str>,
    pci_order: bool,
    query: impl FnOnce() -> Vec<SmiGpu>,
) -> Vec<Gpu> {
    let Some(visible) = visible else {
        return query().into_iter().map(SmiGpu::into_gpu).collect();
    };
    let entries = parse_cuda_visible_devices(visible);
    if entries.iter().all(|id| id.starts_with("MIG-")) {
        // Nothing nvidia-smi lists could describe them.
        return entries.into_iter().map(undescribed_gpu).collect();
    }
    let known = query();
    // CUDA numbers devices fastest first unless told PCI order, and nvidia-smi in PCI
    // order: an index names the same GPU in both only then, or when all GPUs are alike.
    let by_index = pci_order
        || known.first().is_some_and(|first| {
            known
                .iter()
                .all(|gpu| gpu.name == first.name && gpu.memory == first.memory)
        });
    entries
        .into_iter()
        .map(|id| match describing(&id, &known, by_index) {
            Some(found) => Gpu {
                name: found.name.clone(),
                memory: found.memory,
                id,
            },
            None => undescribed_gpu(id),
        })
        .collect()
}

fn undescribed_gpu(id: String) -> Gpu {
    Gpu {
        id,
        name: None,
        memory: None,
    }
}

/// The listed GPU that a `CUDA_VISIBLE_DEVICES` entry names: by index, or by UUID or a
/// unique UUID prefix as CUDA accepts.
fn describing<'a>(entry: &str, known: &'a [SmiGpu], by_index: bool) -> Option<&'a SmiGpu> {
    if let Ok(index) = entry.parse::<u32>() {
        return by_index
            .then(|| known.iter().find(|gpu| gpu.index == index))
            .flatten();
    }
    let mut matching = known
        .iter()
        .filter(|gpu| gpu.uuid.as_deref().is_some_and(|u| u.starts_with(entry)));
    match (matching.next(), matching.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// I/O: read files, run nvidia-smi, call the parsers.
// ---------------------------------------------------------------------------------------

fn read_file(path: &Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "cannot read");
            None
        }
    }
}

fn detect_hostname() -> String {
    match nix::unistd::gethostname().map(std::ffi::OsString::into_string) {
        Ok(Ok(name)) if !name.is_empty() => name,
        Ok(name) => {
            tracing::warn!(
                ?name,
                "the host name is empty or not UTF-8; using localhost"
            );
            "localhost".to_owned()
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read the host name; using localhost");
            "localhost".to_owned()
        }
    }
}

/// The cgroup holding `controller` for this process.
fn read_own_cgroup(controller: &str) -> Option<CgroupDirs> {
    let proc_cgroup = read_file(Path::new("/proc/self/cgroup"))?;
    let mountinfo = read_file(Path::new("/proc/self/mountinfo"))?;
    let found = locate_cgroup(controller, &proc_cgroup, &mountinfo);
    tracing::debug!(controller, cgroup = ?found, "located the cgroup");
    found
}

fn detect_cpus() -> ResourceAmount {
    let counted = affinity_cpus().or_else(|| match thread::available_parallelism() {
        Ok(n) => Some(n.get() as u64),
        Err(error) => {
            tracing::warn!(%error, "cannot count the CPUs; assuming one");
            None
        }
    });
    let counted = ResourceAmount::from(counted.unwrap_or(1));
    match read_own_cgroup("cpu").and_then(|cgroup| cgroup_cpu_quota(&cgroup, &read_file)) {
        Some(quota) => counted.min(quota),
        None => counted,
    }
}

/// The CPUs in the calling thread's affinity mask.
fn affinity_cpus() -> Option<u64> {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;

    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => {
            // `CpuSet::count()` is the set's capacity, not how many CPUs are in it.
            let count = (0..CpuSet::count())
                .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                .count();
            (count > 0).then_some(count as u64)
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read the CPU affinity mask; using available_parallelism");
            None
        }
    }
}

fn detect_memory() -> u64 {
    let total = read_file(Path::new("/proc/meminfo")).and_then(|text| parse_meminfo(&text));
    let limit =
        read_own_cgroup("memory").and_then(|cgroup| cgroup_memory_limit(&cgroup, &read_file));
    match (total, limit) {
        (Some(total), Some(limit)) => total.min(limit),
        (Some(total), None) => total,
        (None, Some(limit)) => {
            tracing::warn!(
                limit,
                "cannot read MemTotal from /proc/meminfo; using the cgroup limit"
            );
            limit
        }
        (None, None) => {
            tracing::warn!(
                "cannot read MemTotal from /proc/meminfo nor a cgroup limit; offering no memory"
            );
            0
        }
    }
}

fn detect_gpus() -> Vec<Gpu> {
    let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let visible = env("CUDA_VISIBLE_DEVICES");
    let pci_order = env("CUDA_DEVICE_ORDER").is_some_and(|order| order.trim() == "PCI_BUS_ID");
    resolve_gpus(visible.as_deref(), pci_order, query_nvidia_smi)
}

fn query_nvidia_smi() -> Vec<SmiGpu> {
    let mut command = Command::new("nvidia-smi");
    command.args([
        "--query-gpu=index,uuid,name,memory.total",
        "--format=csv,noheader,nounits",
    ]);
    match run_with_deadline(command, NVIDIA_SMI_TIMEOUT) {
        Ok(output) => parse_nvidia_smi(&output),
        Err(CommandFailure::NotFound) => {
            tracing::debug!("nvidia-smi is not installed; assuming no GPU");
            Vec::new()
        }
        Err(error) => {
            tracing::warn!(%error, "nvidia-smi failed; assuming no GPU");
            Vec::new()
        }
    }
}

/// Why a command gave no output.
#[derive(Debug, thiserror::Error)]
enum CommandFailure {
    #[error("the program is not installed")]
    NotFound,
    #[error("cannot start the program")]
    Spawn(#[source] io::Error),
    #[error("cannot wait for the program")]
    Wait(#[source] io::Error),
    #[error("the program ran longer than {0:?} and was killed")]
    TimedOut(Duration),
    #[error("the program exited with {0}")]
    Status(ExitStatus),
    #[error("cannot read the program's output")]
    Read(#[source] io::Error),
}

/// Runs `command` and returns its standard output, killing it after `timeout`. The output
/// is drained by a thread so a chatty program cannot block on a full pipe.
fn run_with_deadline(mut command: Command, timeout: Duration) -> Result<String, CommandFailure> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => CommandFailure::NotFound,
            _ => CommandFailure::Spawn(error),
        })?;
    let reader = child.stdout.take().map(|mut stdout| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            stdout.read_to_end(&mut bytes).map(|_| bytes)
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
            outcome => {
                if let Err(error) = child.kill().and_then(|()| child.wait()) {
                    tracing::debug!(%error, "cannot kill a stuck command");
                }
                return Err(match outcome {
                    Err(error) => CommandFailure::Wait(error),
                    _ => CommandFailure::TimedOut(timeout),
                });
            }
        }
    };
    if !status.success() {
        return Err(CommandFailure::Status(status));
    }
    let bytes = match reader.map(thread::JoinHandle::join) {
        None => Vec::new(),
        Some(Ok(read)) => read.map_err(CommandFailure::Read)?,
        Some(Err(_panicked)) => {
            return Err(CommandFailure::Read(io::Error::other(
                "the output reader panicked",
            )));
        }
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn amount(text: &str) -> ResourceAmount {
        text.parse().unwrap()
    }

    fn machine(cpus: &str, memory: u64, gpus: &[&str]) -> Machine {
        Machine {
            hostname: "test".into(),
            cpus: amount(cpus),
            memory,
            gpus: gpus
                .iter()
                .map(|id| undescribed_gpu((*id).into()))
                .collect(),
        }
    }

    fn cpus_of(nodes: &[LocalNode]) -> Vec<Option<ResourceAmount>> {
        nodes.iter().map(|n| n.resources.get(CPU)).collect()
    }

    fn gpu_ids_of(nodes: &[LocalNode]) -> Vec<Vec<String>> {
        nodes.iter().map(|n| n.gpu_ids.clone()).collect()
    }

    // ---- plan_nodes ----

    #[test]
    fn two_cpus_split_into_two_nodes_give_one_each() {
        let nodes = plan_nodes(&machine("2", 0, &[]), &Overrides::default(), 2).unwrap();
        assert_eq!(cpus_of(&nodes), [Some(amount("1")), Some(amount("1"))]);
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["local-0", "local-1"]);
    }

    #[test]
    fn three_cpus_into_two_nodes_give_the_first_node_the_extra_one() {
        let nodes = plan_nodes(&machine("3", 0, &[]), &Overrides::default(), 2).unwrap();
        assert_eq!(cpus_of(&nodes), [Some(amount("2")), Some(amount("1"))]);
    }

    #[test]
    fn one_cpu_into_four_nodes_is_split_exactly_into_quarters() {
        let nodes = plan_nodes(&machine("1", 0, &[]), &Overrides::default(), 4).unwrap();
        assert_eq!(cpus_of(&nodes), vec![Some(amount("0.25")); 4]);
    }

    #[test]
    fn one_and_a_half_cpus_into_two_nodes_give_three_quarters_each() {
        let nodes = plan_nodes(&machine("1.5", 0, &[]), &Overrides::default(), 2).unwrap();
        assert_eq!(
            cpus_of(&nodes),
            [Some(amount("0.75")), Some(amount("0.75"))]
        );
    }

    #[test]
    fn a_fractional_rest_goes_to_the_first_node_with_the_fewest_whole_cpus() {
        let plan = |cpus, nodes| {
            cpus_of(&plan_nodes(&machine(cpus, 0, &[]), &Overrides::default(), nodes).unwrap())
        };
        assert_eq!(plan("2.5", 2), [Some(amount("1.5")), Some(amount("1"))]);
        assert_eq!(plan("3.5", 2), [Some(amount("2")), Some(amount("1.5"))]);
    }

    #[test]
    fn an_inexact_split_adds_up_to_the_total_in_steps() {
        let nodes = plan_nodes(&machine("1", 0, &[]), &Overrides::default(), 3).unwrap();
        assert_eq!(
            cpus_of(&nodes),
            [
                Some(amount("0.3334")),
                Some(amount("0.3333")),
                Some(amount("0.3333"))
            ]
        );
        assert_eq!(
            plan_nodes(&machine("0.0002", 0, &[]), &Overrides::default(), 3)
                .map(|nodes| cpus_of(&nodes))
                .unwrap(),
            [Some(ResourceAmount::STEP), Some(ResourceAmount::STEP), None]
        );
    }

    #[test]
    fn every_split_adds_up_to_the_total_and_is_even_within_one_unit() {
        for steps in (0..60_000u128)
            .step_by(997)
            .chain([1, 9_999, 10_000, 10_001])
        {
            let total = ResourceAmount::from_steps(steps);
            for parts in [1, 2, 3, 4, 7, 16, 1024] {
                let shares: Vec<ResourceAmount> = split_amount(total, parts).collect();
                assert_eq!(shares.len(), parts as usize);
                assert_eq!(shares.iter().copied().sum::<ResourceAmount>(), total);
                let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(
                    max.steps() - min.steps() <= STEPS_PER_UNIT,
                    "{total} / {parts}"
                );
            }
        }
    }

    #[test]
    fn num_gpus_fakes_gpus_on_a_machine_without_any() {
        let overrides = Overrides {
            num_gpus: Some(2),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&machine("1", 0, &[]), &overrides, 1).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["0", "1"]]);
        assert_eq!(nodes[0].resources.get(GPU), Some(amount("2")));
    }

    #[test]
    fn num_gpus_takes_the_first_detected_gpus_and_pads_with_unused_indexes() {
        let with = |num_gpus| Overrides {
            num_gpus: Some(num_gpus),
            ..Overrides::default()
        };
        let gpus = machine("1", 0, &["GPU-a", "GPU-b", "GPU-c"]);
        let nodes = plan_nodes(&gpus, &with(2), 1).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["GPU-a", "GPU-b"]]);

        let nodes = plan_nodes(&machine("1", 0, &["1"]), &with(3), 1).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["1", "0", "2"]]);

        let nodes = plan_nodes(&gpus, &with(0), 1).unwrap();
        assert!(nodes[0].gpu_ids.is_empty());
        assert!(!nodes[0].resources.contains(GPU));
    }

    #[test]
    fn a_cuda_visible_devices_subset_is_dealt_out_in_its_order() {
        let mut m = machine("2", 0, &[]);
        m.gpus = resolve_gpus(Some("1,3"), false, Vec::new);
        let nodes = plan_nodes(&m, &Overrides::default(), 2).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["1"], vec!["3"]]);
        for node in &nodes {
            assert_eq!(node.resources.get(GPU), Some(amount("1")));
        }
    }

    #[test]
    fn gpus_are_dealt_as_contiguous_runs_and_a_node_without_one_lacks_the_key() {
        let m = machine("4", 0, &["0", "1", "2"]);
        let nodes = plan_nodes(&m, &Overrides::default(), 2).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["0", "1"], vec!["2"]]);
        assert_eq!(nodes[0].resources.get(GPU), Some(amount("2")));

        let nodes = plan_nodes(&machine("4", 0, &["0"]), &Overrides::default(), 2).unwrap();
        assert_eq!(gpu_ids_of(&nodes), [vec!["0"], vec![]]);
        assert!(!nodes[1].resources.contains(GPU));
    }

    #[test]
    fn memory_bytes_are_split_evenly_with_the_remainder_to_the_first_nodes() {
        let nodes = plan_nodes(&machine("3", 11, &[]), &Overrides::default(), 3).unwrap();
        let memory: Vec<_> = nodes.iter().map(|n| n.resources.get(MEMORY)).collect();
        assert_eq!(
            memory,
            [Some(amount("4")), Some(amount("4")), Some(amount("3"))]
        );

        let nodes = plan_nodes(&machine("3", 2, &[]), &Overrides::default(), 3).unwrap();
        assert!(!nodes[2].resources.contains(MEMORY));
    }

    #[test]
    fn overrides_replace_what_was_detected() {
        let overrides = Overrides {
            num_cpus: Some(amount("8")),
            memory: Some(1000),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&machine("2", 5, &[]), &overrides, 1).unwrap();
        let expected = Resources::new()
            .with(CPU, amount("8"))
            .with(MEMORY, amount("1000"));
        assert_eq!(nodes[0].resources, expected);
    }

    #[test]
    fn custom_resources_split_like_cpus_and_zero_shares_are_absent() {
        let overrides = Overrides {
            resources: "custom=3,tiny=1,none=0".parse().unwrap(),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&machine("0", 0, &[]), &overrides, 2).unwrap();
        assert_eq!(
            nodes[0].resources,
            Resources::new()
                .with("custom", amount("2"))
                .with("tiny", amount("0.5"))
        );
        assert_eq!(
            nodes[1].resources,
            Resources::new()
                .with("custom", amount("1"))
                .with("tiny", amount("0.5"))
        );
    }

    #[test]
    fn node_counts_outside_one_to_1024_are_refused_naming_the_option() {
        let m = machine("1", 0, &[]);
        let err = plan_nodes(&m, &Overrides::default(), 0).unwrap_err();
        assert_eq!(err, DetectError::NodeCount { nodes: 0 });
        assert_eq!(err.to_string(), "--nodes must be between 1 and 1024, got 0");
        assert!(plan_nodes(&m, &Overrides::default(), 1025).is_err());
        assert_eq!(
            plan_nodes(&m, &Overrides::default(), 1024).unwrap().len(),
            1024
        );
    }

    #[test]
    fn too_many_gpus_are_refused() {
        let overrides = Overrides {
            num_gpus: Some(u32::MAX),
            ..Overrides::default()
        };
        let err = plan_nodes(&machine("1", 0, &[]), &overrides, 1).unwrap_err();
        assert_eq!(err, DetectError::GpuCount { gpus: u32::MAX });
    }

    #[test]
    fn reserved_names_in_resources_point_to_their_own_option() {
        for (text, name, option) in [
            ("CPU=1", CPU, "--num-cpus"),
            ("a=1,GPU=1", GPU, "--num-gpus"),
            ("memory=10GB", MEMORY, "--memory"),
        ] {
            let overrides = Overrides {
                resources: text.parse().unwrap(),
                ..Overrides::default()
            };
            let err = plan_nodes(&machine("1", 0, &[]), &overrides, 1).unwrap_err();
            assert_eq!(
                err,
                DetectError::ReservedInResources {
                    name: name.into(),
                    option
                }
            );
            assert_eq!(
                err.to_string(),
                format!("resource `{name}` cannot be set with --resources, use {option} instead")
            );
        }
    }

    // ---- parsers ----

    #[test]
    fn meminfo_gives_memtotal_in_bytes() {
        let cases: &[(&str, Option<u64>)] = &[
            (
                "MemTotal:       24684092 kB\nMemFree: 1 kB\n",
                Some(24_684_092 * 1024),
            ),
            ("MemFree: 1 kB\nMemTotal: 2 kB", Some(2048)),
            ("MemTotal: 7", Some(7)),
            ("MemTotal: lots kB", None),
            ("MemTotal: 1 MB", None),
            ("MemTotal: 1 kB extra", None),
            ("MemTotal: 18446744073709551615 kB", None),
            ("MemTotal:", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_meminfo(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn cpu_max_keeps_fractional_quotas_exactly() {
        let cases: &[(&str, Option<Limit<ResourceAmount>>)] = &[
            ("max 100000\n", Some(Limit::Unlimited)),
            ("max", Some(Limit::Unlimited)),
            ("150000 100000\n", Some(Limit::At(amount("1.5")))),
            ("200000 100000", Some(Limit::At(amount("2")))),
            ("50000", Some(Limit::At(amount("0.5")))),
            ("100000 30000", Some(Limit::At(amount("3.3333")))),
            ("1 1000000000", Some(Limit::At(ResourceAmount::STEP))),
            ("0 100000", None),
            ("100000 0", None),
            ("lots 100000", None),
            ("max often", None),
            ("1 2 3", None),
            ("-1 100000", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_cpu_max(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn v1_quota_minus_one_means_none() {
        let cases: &[(&str, &str, Option<Limit<ResourceAmount>>)] = &[
            ("-1\n", "100000\n", Some(Limit::Unlimited)),
            ("-1", "garbage", Some(Limit::Unlimited)),
            ("150000\n", "100000\n", Some(Limit::At(amount("1.5")))),
            ("400000", "100000", Some(Limit::At(amount("4")))),
            ("150000", "0", None),
            ("150000", "", None),
            ("", "100000", None),
            ("1.5", "100000", None),
        ];
        for (quota, period, expected) in cases {
            assert_eq!(
                parse_v1_quota(quota, period),
                *expected,
                "{quota:?} {period:?}"
            );
        }
    }

    #[test]
    fn v1_memory_limits_treat_the_page_rounded_sentinel_as_unlimited() {
        let cases: &[(&str, Option<Limit<u64>>)] = &[
            ("9223372036854771712\n", Some(Limit::Unlimited)),
            ("9223372036854775807", Some(Limit::Unlimited)),
            ("4611686018427387904", Some(Limit::Unlimited)),
            ("-1", Some(Limit::Unlimited)),
            ("1073741824\n", Some(Limit::At(1 << 30))),
            ("max", None),
            ("", None),
            ("-2", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_v1_memory_limit(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn v1_memory_stat_gives_the_hierarchical_limit() {
        let cases: &[(&str, Option<Limit<u64>>)] = &[
            (
                "cache 1\nhierarchical_memory_limit 9223372036854771712\nhierarchical_memsw_limit 1\n",
                Some(Limit::Unlimited),
            ),
            ("hierarchical_memory_limit 2048", Some(Limit::At(2048))),
            ("hierarchical_memory_limit", None),
            ("hierarchical_memory_limit x", None),
            ("hierarchical_memsw_limit 1", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_v1_memory_stat(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn v2_memory_max_is_bytes_or_max() {
        let cases: &[(&str, Option<Limit<u64>>)] = &[
            ("max\n", Some(Limit::Unlimited)),
            ("536870912\n", Some(Limit::At(1 << 29))),
            ("", None),
            ("-1", None),
            ("1G", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_v2_memory_max(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn nvidia_smi_rows_give_gpus_with_memory_in_bytes() {
        let gpu = |index, uuid: Option<&str>, name: Option<&str>, memory| SmiGpu {
            index,
            uuid: uuid.map(Into::into),
            name: name.map(Into::into),
            memory,
        };
        let cases: Vec<(&str, Vec<SmiGpu>)> = vec![
            (
                "0, GPU-8932f937-d72c, NVIDIA H200, 143771\n1, GPU-11aa, NVIDIA H200, 143771\n",
                vec![
                    gpu(
                        0,
                        Some("GPU-8932f937-d72c"),
                        Some("NVIDIA H200"),
                        Some(143_771 << 20),
                    ),
                    gpu(
                        1,
                        Some("GPU-11aa"),
                        Some("NVIDIA H200"),
                        Some(143_771 << 20),
                    ),
                ],
            ),
            (
                "2, [N/A], , [Not Supported]",
                vec![gpu(2, None, None, None)],
            ),
            (
                "x, GPU-1, A, 1\n0, GPU-1, A\n0, GPU-1, A, 1, extra\n\n",
                vec![],
            ),
            (
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                vec![],
            ),
            ("", vec![]),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_nvidia_smi(text), expected, "{text:?}");
        }
    }

    #[test]
    fn cuda_visible_devices_is_read_as_cuda_reads_it() {
        let cases: &[(&str, &[&str])] = &[
            ("0,1", &["0", "1"]),
            (" 2 , 3 ", &["2", "3"]),
            ("GPU-8932f937,MIG-abc/1/2", &["GPU-8932f937", "MIG-abc/1/2"]),
            ("", &[]),
            ("-1", &[]),
            ("NoDevFiles", &[]),
            ("0,-1,1", &["0"]),
            ("1,,2", &["1"]),
            ("1,1,0", &["1", "0"]),
            ("GPU-", &[]),
            ("gpu0", &[]),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_cuda_visible_devices(text), *expected, "{text:?}");
        }
    }

    // ---- combining ----

    fn reader(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> + use<> {
        let files: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(path, text)| (PathBuf::from(path), (*text).to_owned()))
            .collect();
        move |path| files.get(path).cloned()
    }

    const HYBRID_PROC_CGROUP: &str = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_hybrid_host_reads_memory_from_the_v1_controller_walking_up() {
        let cgroup = locate_cgroup("memory", HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(
            cgroup,
            CgroupDirs {
                version: Hierarchy::V1,
                dirs: vec![
                    "/sys/fs/cgroup/memory/process_api/abc".into(),
                    "/sys/fs/cgroup/memory/process_api".into(),
                    "/sys/fs/cgroup/memory".into(),
                ],
            }
        );
        let unlimited = "9223372036854771712\n";
        let read = reader(&[
            (
                "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
                unlimited,
            ),
            (
                "/sys/fs/cgroup/memory/process_api/abc/memory.stat",
                "hierarchical_memory_limit 9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                "8589934592\n",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", unlimited),
        ]);
        assert_eq!(cgroup_memory_limit(&cgroup, &read), Some(8 << 30));

        let only_stat = reader(&[(
            "/sys/fs/cgroup/memory/process_api/abc/memory.stat",
            "hierarchical_memory_limit 4096\n",
        )]);
        assert_eq!(cgroup_memory_limit(&cgroup, &only_stat), Some(4096));
        assert_eq!(cgroup_memory_limit(&cgroup, &reader(&[])), None);
    }

    #[test]
    fn a_hybrid_host_reads_the_cpu_quota_from_the_v1_controller() {
        let cgroup = locate_cgroup("cpu", HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(cgroup.dirs, [PathBuf::from("/sys/fs/cgroup/cpu")]);
        let read = reader(&[
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "250000\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(cgroup_cpu_quota(&cgroup, &read), Some(amount("2.5")));
        let none = reader(&[
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(cgroup_cpu_quota(&cgroup, &none), None);
    }

    #[test]
    fn a_v2_host_takes_the_smallest_quota_and_limit_of_the_ancestors() {
        let mountinfo = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let cgroup = locate_cgroup("cpu", "0::/job/worker\n", mountinfo).unwrap();
        assert_eq!(cgroup.version, Hierarchy::V2);
        let read = reader(&[
            ("/sys/fs/cgroup/job/worker/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/job/cpu.max", "150000 100000\n"),
            ("/sys/fs/cgroup/job/worker/memory.max", "1048576\n"),
            ("/sys/fs/cgroup/job/memory.max", "max\n"),
            ("/sys/fs/cgroup/memory.max", "not a number\n"),
        ]);
        assert_eq!(cgroup_cpu_quota(&cgroup, &read), Some(amount("1.5")));
        assert_eq!(cgroup_memory_limit(&cgroup, &read), Some(1 << 20));
    }

    #[test]
    fn cgroup_paths_are_taken_relative_to_the_mounted_root_and_never_escape_it() {
        let mountinfo = "30 23 0:26 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let inside = locate_cgroup("memory", "0::/docker/x/a\n", mountinfo).unwrap();
        assert_eq!(
            inside.dirs,
            [
                PathBuf::from("/sys/fs/cgroup/a"),
                PathBuf::from("/sys/fs/cgroup")
            ]
        );
        // A path leaving the mounted root (a cgroup namespace) is read at the mount point,
        // which holds this process's own limits.
        assert_eq!(
            locate_cgroup("memory", "0::/../../elsewhere\n", mountinfo).map(|c| c.dirs),
            Some(vec![PathBuf::from("/sys/fs/cgroup")])
        );
        let mount = CgroupMount {
            root: "/docker/x".into(),
            mount_point: "/sys/fs/cgroup".into(),
            hierarchy: Hierarchy::V2,
            options: vec!["rw".into()],
        };
        assert_eq!(
            dirs_up(&mount, "/../../elsewhere"),
            [PathBuf::from("/sys/fs/cgroup")]
        );
        assert_eq!(dirs_up(&mount, "/other"), [PathBuf::from("/sys/fs/cgroup")]);
        assert_eq!(locate_cgroup("memory", "0::/\n", ""), None);
        assert_eq!(locate_cgroup("memory", "", HYBRID_MOUNTINFO), None);
    }

    fn smi_gpu(index: u32, uuid: &str, name: &str) -> SmiGpu {
        SmiGpu {
            index,
            uuid: Some(uuid.into()),
            name: Some(name.into()),
            memory: Some(1 << 30),
        }
    }

    #[test]
    fn without_cuda_visible_devices_the_gpus_of_nvidia_smi_are_named_by_uuid() {
        let gpus = resolve_gpus(None, false, || {
            vec![
                smi_gpu(0, "GPU-a", "H200"),
                SmiGpu {
                    index: 1,
                    uuid: None,
                    name: None,
                    memory: None,
                },
            ]
        });
        assert_eq!(
            gpus,
            [
                Gpu {
                    id: "GPU-a".into(),
                    name: Some("H200".into()),
                    memory: Some(1 << 30)
                },
                undescribed_gpu("1".into()),
            ]
        );
        assert!(resolve_gpus(None, false, Vec::new).is_empty());
    }

    #[test]
    fn cuda_visible_devices_is_honoured_and_described_where_it_can_be_matched() {
        let alike = || vec![smi_gpu(0, "GPU-aa", "H200"), smi_gpu(1, "GPU-bb", "H200")];
        let gpus = resolve_gpus(Some("1,GPU-a,MIG-x,7"), false, alike);
        let names: Vec<_> = gpus
            .iter()
            .map(|g| (g.id.as_str(), g.name.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("1", Some("H200")),
                ("GPU-a", Some("H200")),
                ("MIG-x", None),
                ("7", None)
            ]
        );

        // Unlike GPUs: an index names a GPU of nvidia-smi only in PCI order.
        let mixed = || vec![smi_gpu(0, "GPU-aa", "A100"), smi_gpu(1, "GPU-bb", "H200")];
        assert_eq!(resolve_gpus(Some("1"), false, mixed)[0].name, None);
        assert_eq!(
            resolve_gpus(Some("1"), true, mixed)[0].name.as_deref(),
            Some("H200")
        );

        // An ambiguous UUID prefix describes nothing.
        let prefixes = || vec![smi_gpu(0, "GPU-a1", "A"), smi_gpu(1, "GPU-a2", "B")];
        assert_eq!(resolve_gpus(Some("GPU-a"), true, prefixes)[0].name, None);
    }

    #[test]
    fn an_empty_cuda_visible_devices_means_no_gpu_without_asking_nvidia_smi() {
        for text in ["", "-1", "NoDevFiles"] {
            let gpus = resolve_gpus(Some(text), false, || panic!("nvidia-smi was run"));
            assert!(gpus.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn a_missing_program_is_told_apart_from_a_failing_one() {
        let missing = run_with_deadline(
            Command::new("trainyard-no-such-program"),
            Duration::from_secs(5),
        );
        assert!(
            matches!(missing, Err(CommandFailure::NotFound)),
            "{missing:?}"
        );

        let mut echo = Command::new("sh");
        echo.args(["-c", "echo 0, GPU-a, X, 1"]);
        assert_eq!(
            run_with_deadline(echo, Duration::from_secs(5)).unwrap(),
            "0, GPU-a, X, 1\n"
        );

        let mut failing = Command::new("sh");
        failing.args(["-c", "exit 3"]);
        let failed = run_with_deadline(failing, Duration::from_secs(5));
        assert!(
            matches!(failed, Err(CommandFailure::Status(_))),
            "{failed:?}"
        );
    }

    #[test]
    fn a_stuck_program_is_killed_at_the_deadline() {
        let mut stuck = Command::new("sleep");
        stuck.arg("30");
        let started = Instant::now();
        let outcome = run_with_deadline(stuck, Duration::from_millis(200));
        assert!(
            matches!(outcome, Err(CommandFailure::TimedOut(_))),
            "{outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn this_machine_offers_at_least_one_cpu_and_some_memory() {
        let machine = Machine::detect();
        assert!(machine.cpus >= ResourceAmount::ONE, "{machine:?}");
        assert!(machine.memory > 0, "{machine:?}");
        assert!(!machine.hostname.is_empty());
    }
}
