//! The CPUs and memory a worker may use: the affinity mask bounded by the cgroup CPU quota
//! (kept exact when fractional), and `MemTotal` bounded by the cgroup memory limit, the
//! smallest of the process's cgroup and its ancestors in either hierarchy version.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::thread;

use trainyard_resources::{ResourceAmount, STEPS_PER_UNIT};

use trainyard_sys::cgroup::{CgroupLookupError, CgroupMount, CgroupQuery, Hierarchy, own_cgroup};

/// cgroup v1 reports "no memory limit" as a page-rounded `i64::MAX`
/// (9223372036854771712); anything this large means unlimited.
const V1_UNLIMITED_MEMORY: u64 = 1 << 62;

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

/// The cgroup holding `controller` for this process.
fn read_own_cgroup(controller: &str) -> Option<CgroupDirs> {
    let proc_cgroup = read_file(Path::new("/proc/self/cgroup"))?;
    let mountinfo = read_file(Path::new("/proc/self/mountinfo"))?;
    let found = locate_cgroup(controller, &proc_cgroup, &mountinfo);
    tracing::debug!(controller, cgroup = ?found, "located the cgroup");
    found
}

pub(super) fn detect_cpus() -> ResourceAmount {
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

pub(super) fn detect_memory() -> u64 {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn amount(text: &str) -> ResourceAmount {
        text.parse().unwrap()
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
}
