//! Which cgroup a process is in, and where that cgroup's directory is: `/proc/<pid>/cgroup`
//! and `/proc/<pid>/mountinfo`, parsed as pure functions that never panic.

use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

use super::member::Hierarchy;

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine<'a> {
    /// The hierarchy id; 0 for the v2 unified hierarchy.
    pub hierarchy_id: u32,
    /// The v1 controllers of the hierarchy (`cpu`, `cpuacct`); empty for the v2 line (`0::/path`).
    pub controllers: Vec<&'a str>,
    /// The cgroup's path inside its hierarchy, starting with `/`.
    pub path: &'a str,
}

/// Parses `/proc/<pid>/cgroup`, skipping malformed lines.
pub fn parse_proc_cgroup(text: &str) -> Vec<CgroupLine<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let hierarchy_id = fields.next()?.trim().parse().ok()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            if !path.starts_with('/') {
                return None;
            }
            let controllers = if controllers.is_empty() {
                Vec::new()
            } else {
                controllers.split(',').collect()
            };
            Some(CgroupLine {
                hierarchy_id,
                controllers,
                path,
            })
        })
        .collect()
}

/// A cgroup (v1 or v2) mount from `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The cgroup path, within its hierarchy, that is mounted (`/` unless a sub-tree is).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Whether it is a v1 (`cgroup`) or the v2 (`cgroup2`) file system.
    pub hierarchy: Hierarchy,
    /// Super options; for v1 they name the controllers (`rw`, `cpu`, `cpuacct`).
    pub options: Vec<String>,
}

/// Parses the cgroup and cgroup2 mounts of `/proc/<pid>/mountinfo`, skipping
/// other and malformed lines.
pub fn parse_cgroup_mounts(text: &str) -> Vec<CgroupMount> {
    text.lines().filter_map(parse_mount_line).collect()
}

/// `id parent major:minor root mount-point options [optional...] - fstype source super-options`
fn parse_mount_line(line: &str) -> Option<CgroupMount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|&field| field == "-")?;
    if separator < 6 {
        return None;
    }
    let hierarchy = match *fields.get(separator + 1)? {
        "cgroup" => Hierarchy::V1,
        "cgroup2" => Hierarchy::V2,
        _ => return None,
    };
    let options = fields
        .get(separator + 3)
        .map(|options| options.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    Some(CgroupMount {
        root: unescape_mount_field(fields[3]),
        mount_point: unescape_mount_field(fields[4]),
        hierarchy,
        options,
    })
}

/// Decodes the octal escapes (`\040` for a space) of a mountinfo path.
fn unescape_mount_field(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .and_then(|digits| {
                let value = digits
                    .iter()
                    .fold(0_u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                u8::try_from(value).ok()
            });
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Which of a process's cgroups [`own_cgroup`] looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupQuery<'a> {
    /// The cgroup in the v1 hierarchy that holds this controller (`memory`, `cpu`).
    V1(&'a str),
    /// The cgroup in the v2 unified hierarchy (the `0::` line).
    V2,
}

/// A process's cgroup in one hierarchy, found by [`own_cgroup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnCgroup {
    /// The cgroup's path inside its hierarchy, as `/proc/<pid>/cgroup` gives it.
    pub path: String,
    /// The mount that shows the cgroup (the one with the deepest root, where several do).
    pub mount: CgroupMount,
    /// The cgroup's directory under [`CgroupMount::mount_point`].
    pub dir: PathBuf,
}

/// Why [`own_cgroup`] found no directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupLookupError {
    /// No v1 hierarchy holding the controller is listed.
    #[error("no {controller} controller line in /proc/self/cgroup")]
    NoControllerLine {
        /// The v1 controller looked for.
        controller: String,
    },
    /// The v2 `0::` line is missing.
    #[error("no 0:: line in /proc/self/cgroup")]
    NoUnifiedLine,
    /// No v1 mount holds the controller.
    #[error("the {controller} controller is not mounted")]
    ControllerNotMounted {
        /// The v1 controller looked for.
        controller: String,
    },
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 mount")]
    NoUnifiedMount,
    /// Every mount of the hierarchy shows another sub-tree, or the path leaves its
    /// root (`/..` under a cgroup namespace).
    #[error("cgroup {path} is outside every mount of its hierarchy")]
    OutsideMounts {
        /// The cgroup's path inside its hierarchy.
        path: String,
        /// The hierarchy's mount with the deepest root: what a process in a cgroup
        /// namespace sees of its own cgroup.
        mount: Box<CgroupMount>,
    },
}

/// This process's cgroup for `query`, given the text of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`, mapped to its directory; the one mapping both limit detection
/// and enforcement use.
pub fn own_cgroup(
    query: CgroupQuery<'_>,
    proc_cgroup: &str,
    mountinfo: &str,
) -> Result<OwnCgroup, CgroupLookupError> {
    let lines = parse_proc_cgroup(proc_cgroup);
    let (hierarchy, line) = match query {
        CgroupQuery::V1(controller) => (
            Hierarchy::V1,
            lines
                .iter()
                .find(|line| line.hierarchy_id != 0 && line.controllers.contains(&controller))
                .ok_or_else(|| CgroupLookupError::NoControllerLine {
                    controller: controller.to_owned(),
                })?,
        ),
        CgroupQuery::V2 => (
            Hierarchy::V2,
            lines
                .iter()
                .find(|line| line.hierarchy_id == 0 && line.controllers.is_empty())
                .ok_or(CgroupLookupError::NoUnifiedLine)?,
        ),
    };
    let mounts: Vec<CgroupMount> = parse_cgroup_mounts(mountinfo)
        .into_iter()
        .filter(|mount| mount.hierarchy == hierarchy)
        .filter(|mount| match query {
            CgroupQuery::V1(controller) => mount.options.iter().any(|o| o == controller),
            CgroupQuery::V2 => true,
        })
        .collect();
    if mounts.is_empty() {
        return Err(match query {
            CgroupQuery::V1(controller) => CgroupLookupError::ControllerNotMounted {
                controller: controller.to_owned(),
            },
            CgroupQuery::V2 => CgroupLookupError::NoUnifiedMount,
        });
    }
    let deepest = mounts
        .iter()
        .max_by_key(|mount| mount.root.components().count())
        .cloned();
    mounts
        .into_iter()
        .filter_map(|mount| translate(line.path, &mount).map(|dir| (mount, dir)))
        .max_by_key(|(mount, _)| mount.root.components().count())
        .map(|(mount, dir)| OwnCgroup {
            path: line.path.to_owned(),
            mount,
            dir,
        })
        .ok_or_else(|| CgroupLookupError::OutsideMounts {
            path: line.path.to_owned(),
            // `mounts` is not empty, so there is a deepest one.
            mount: Box::new(deepest.unwrap_or_else(|| unreachable!("mounts is not empty"))),
        })
}

/// Maps a cgroup path to its directory under `mount`, if the mount shows it.
fn translate(cgroup_path: &str, mount: &CgroupMount) -> Option<PathBuf> {
    let path = Path::new(cgroup_path);
    let plain = |p: &Path| {
        p.is_absolute()
            && p.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            })
    };
    if !plain(path) || !plain(&mount.root) {
        return None;
    }
    let relative = path.strip_prefix(&mount.root).ok()?;
    if relative.as_os_str().is_empty() {
        Some(mount.mount_point.clone())
    } else {
        Some(mount.mount_point.join(relative))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST_CGROUP: &str =
        "9:name=systemd:/\n4:memory:/process_api/58c0\n1:cpu,cpuacct:/\n0::/\n";
    const HOST_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    #[test]
    fn proc_cgroup_lines_are_parsed_and_malformed_ones_skipped() {
        let cases: &[(&str, Vec<CgroupLine<'_>>)] = &[
            ("", vec![]),
            ("garbage\n::\nx:memory:/a\n4:memory:relative\n", vec![]),
            (
                "4:memory:/a/b\n",
                vec![CgroupLine {
                    hierarchy_id: 4,
                    controllers: vec!["memory"],
                    path: "/a/b",
                }],
            ),
            (
                "1:cpu,cpuacct:/\n0::/user.slice\n",
                vec![
                    CgroupLine {
                        hierarchy_id: 1,
                        controllers: vec!["cpu", "cpuacct"],
                        path: "/",
                    },
                    CgroupLine {
                        hierarchy_id: 0,
                        controllers: vec![],
                        path: "/user.slice",
                    },
                ],
            ),
            (
                "4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/\n",
                vec![
                    CgroupLine {
                        hierarchy_id: 4,
                        controllers: vec!["memory"],
                        path: "/process_api/abc",
                    },
                    CgroupLine {
                        hierarchy_id: 2,
                        controllers: vec!["cpu", "cpuacct"],
                        path: "/",
                    },
                    CgroupLine {
                        hierarchy_id: 0,
                        controllers: vec![],
                        path: "/",
                    },
                ],
            ),
            (
                "9:name=systemd:/a:b",
                vec![CgroupLine {
                    hierarchy_id: 9,
                    controllers: vec!["name=systemd"],
                    path: "/a:b",
                }],
            ),
            (
                "0::/../../x",
                vec![CgroupLine {
                    hierarchy_id: 0,
                    controllers: vec![],
                    path: "/../../x",
                }],
            ),
            ("x:memory:/\n4:memory\n4:memory:relative\n\n", vec![]),
            (
                "2:memory:/with:colon\n",
                vec![CgroupLine {
                    hierarchy_id: 2,
                    controllers: vec!["memory"],
                    path: "/with:colon",
                }],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(&parse_proc_cgroup(text), expected, "input {text:?}");
        }
    }
    #[test]
    fn mountinfo_lines_yield_only_cgroup_mounts_and_never_panic() {
        let mount = |root: &str, point: &str, hierarchy, options: &[&str]| CgroupMount {
            root: PathBuf::from(root),
            mount_point: PathBuf::from(point),
            hierarchy,
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        };
        let cases: &[(&str, Option<CgroupMount>)] = &[
            ("", None),
            ("-", None),
            ("1 2 3 - cgroup cgroup rw,memory", None),
            ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw", None),
            (
                "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
                Some(mount(
                    "/",
                    "/sys/fs/cgroup/memory",
                    Hierarchy::V1,
                    &["rw", "memory"],
                )),
            ),
            (
                "35 31 0:32 /a /m rw shared:5 master:1 - cgroup cgroup rw,cpu,memory",
                Some(mount("/a", "/m", Hierarchy::V1, &["rw", "cpu", "memory"])),
            ),
            (
                "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2",
                Some(mount("/", "/sys/fs/cgroup/unified", Hierarchy::V2, &[])),
            ),
            (
                r"41 31 0:38 /a\040b /mnt/c\134g rw - cgroup2 none rw",
                Some(mount("/a b", r"/mnt/c\g", Hierarchy::V2, &["rw"])),
            ),
            (
                r"41 31 0:38 /trailing\ /bad\09 rw - cgroup2 none rw",
                Some(mount(r"/trailing\", r"/bad\09", Hierarchy::V2, &["rw"])),
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(&parse_mount_line(line), expected, "input {line:?}");
        }
    }
    #[test]
    fn the_own_cgroup_is_mapped_through_the_mount_root() {
        let v2_only_cgroup = "0::/user.slice/job\n";
        let v2_only_mounts = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let nested_root_mounts = "35 31 0:32 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
             36 31 0:32 / /host/memory rw - cgroup cgroup rw,memory\n";
        let ok = |p: &str| Ok(PathBuf::from(p));
        let cases: &[(CgroupQuery<'_>, &str, &str, Result<PathBuf, ()>)] = &[
            (
                CgroupQuery::V1("memory"),
                HOST_CGROUP,
                HOST_MOUNTINFO,
                ok("/sys/fs/cgroup/memory/process_api/58c0"),
            ),
            (
                CgroupQuery::V2,
                HOST_CGROUP,
                HOST_MOUNTINFO,
                ok("/sys/fs/cgroup/unified"),
            ),
            (
                CgroupQuery::V2,
                v2_only_cgroup,
                v2_only_mounts,
                ok("/sys/fs/cgroup/user.slice/job"),
            ),
            (
                CgroupQuery::V1("memory"),
                v2_only_cgroup,
                v2_only_mounts,
                Err(()),
            ),
            // The deepest mount that shows the cgroup wins.
            (
                CgroupQuery::V1("memory"),
                HOST_CGROUP,
                nested_root_mounts,
                ok("/sys/fs/cgroup/memory/58c0"),
            ),
            // Mount root equal to the cgroup: the mount point itself.
            (
                CgroupQuery::V1("memory"),
                "4:memory:/process_api\n",
                nested_root_mounts,
                ok("/sys/fs/cgroup/memory"),
            ),
            // A cgroup outside the mounted subtree (host cgroup namespace) is refused.
            (
                CgroupQuery::V1("memory"),
                "4:memory:/elsewhere\n",
                "35 31 0:32 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
                Err(()),
            ),
            (
                CgroupQuery::V1("memory"),
                "4:memory:/../x\n",
                HOST_MOUNTINFO,
                Err(()),
            ),
            (CgroupQuery::V1("memory"), HOST_CGROUP, "", Err(())),
            (CgroupQuery::V1("memory"), "", HOST_MOUNTINFO, Err(())),
            (CgroupQuery::V2, "4:memory:/a\n", HOST_MOUNTINFO, Err(())),
        ];
        for (query, cgroup, mountinfo, expected) in cases {
            let found = own_cgroup(*query, cgroup, mountinfo);
            match (expected, &found) {
                (Ok(want), Ok(got)) => assert_eq!(&got.dir, want),
                (Err(()), Err(why)) => assert!(!why.to_string().is_empty()),
                _ => panic!("{query:?} {cgroup:?}: expected {expected:?}, got {found:?}"),
            }
        }
    }
    #[test]
    fn the_own_cgroup_of_any_v1_controller_keeps_its_path_and_mount() {
        let cpu = own_cgroup(CgroupQuery::V1("cpu"), HOST_CGROUP, HOST_MOUNTINFO).expect("cpu");
        assert_eq!(cpu.path, "/");
        assert_eq!(cpu.mount.mount_point, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(cpu.dir, PathBuf::from("/sys/fs/cgroup/cpu"));
        let memory =
            own_cgroup(CgroupQuery::V1("memory"), HOST_CGROUP, HOST_MOUNTINFO).expect("memory");
        assert_eq!(memory.path, "/process_api/58c0");
        assert_eq!(memory.mount.hierarchy, Hierarchy::V1);
        let cases: &[(CgroupQuery<'_>, &str, &str, CgroupLookupError)] = &[
            (
                CgroupQuery::V1("pids"),
                HOST_CGROUP,
                HOST_MOUNTINFO,
                CgroupLookupError::NoControllerLine {
                    controller: "pids".into(),
                },
            ),
            (
                CgroupQuery::V1("memory"),
                HOST_CGROUP,
                "",
                CgroupLookupError::ControllerNotMounted {
                    controller: "memory".into(),
                },
            ),
            (
                CgroupQuery::V2,
                "",
                HOST_MOUNTINFO,
                CgroupLookupError::NoUnifiedLine,
            ),
            (
                CgroupQuery::V2,
                "0::/\n",
                "",
                CgroupLookupError::NoUnifiedMount,
            ),
            (
                CgroupQuery::V2,
                "0::/../../elsewhere\n",
                "30 23 0:26 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                CgroupLookupError::OutsideMounts {
                    path: "/../../elsewhere".into(),
                    mount: Box::new(CgroupMount {
                        root: "/docker/x".into(),
                        mount_point: "/sys/fs/cgroup".into(),
                        hierarchy: Hierarchy::V2,
                        options: vec!["rw".into()],
                    }),
                },
            ),
        ];
        for (query, cgroup, mountinfo, expected) in cases {
            assert_eq!(
                own_cgroup(*query, cgroup, mountinfo).as_ref(),
                Err(expected),
                "{query:?} {cgroup:?}"
            );
        }
    }
    #[test]
    fn several_mountinfo_lines_give_their_cgroup_mounts_only() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
41 31 0:38 /docker/x /sys/fs/cgroup/unified\\040dir rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /broken rw,relatime cgroup cgroup rw
43 31 0:40 / /short - cgroup
junk
";
        assert_eq!(
            parse_cgroup_mounts(text),
            [
                CgroupMount {
                    root: "/".into(),
                    mount_point: "/sys/fs/cgroup/memory".into(),
                    hierarchy: Hierarchy::V1,
                    options: vec!["rw".into(), "memory".into()],
                },
                CgroupMount {
                    root: "/docker/x".into(),
                    mount_point: "/sys/fs/cgroup/unified dir".into(),
                    hierarchy: Hierarchy::V2,
                    options: vec!["rw".into()],
                },
            ]
        );
    }
    #[test]
    fn mountinfo_escapes_are_undone_and_broken_ones_kept() {
        for (field, expected) in [
            ("a\\040b", "a b"),
            ("\\134", "\\"),
            ("tab\\011", "tab\t"),
            ("a\\04", "a\\04"),
            ("a\\", "a\\"),
            ("\\999", "\\999"),
            ("\\400", "\\400"),
            ("plain", "plain"),
        ] {
            assert_eq!(
                unescape_mount_field(field),
                PathBuf::from(expected),
                "{field:?}"
            );
        }
    }
}
