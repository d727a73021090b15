//! The steps of probing a cgroup, giving a run's cgroup the memory controller, and limiting
//! a worker's.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::errno::Errno;

use super::CgroupError;
use super::owner::{DIR_PREFIX, LEAF_RUN, Owner, owned_dir_name};
use super::tree::{Tree, parse_procs, write_value};

/// Longest run or worker name accepted.
pub(super) const MAX_NAME_LEN: usize = 200;

/// Distinguishes the probe directories of threads probing at the same time.
static PROBE_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Creates and removes a uniquely named directory in `dir`.
pub(super) fn check_writable(tree: &dyn Tree, dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(
        "{DIR_PREFIX}probe.{}-{}",
        PROBE_COUNTER.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    ));
    tree.mkdir(&probe)
        .map_err(|err| format!("cannot create a cgroup in {}: {err}", dir.display()))?;
    tree.rmdir(&probe)
        .map_err(|err| format!("cannot remove probe cgroup {}: {err}", probe.display()))
}

/// Checks that a v2 cgroup may use the memory controller.
pub(super) fn check_v2_memory(tree: &dyn Tree, dir: &Path) -> Result<(), String> {
    let file = dir.join("cgroup.controllers");
    let text = tree
        .read(&file)
        .map_err(|err| format!("cannot read {}: {err}", file.display()))?;
    if lists_controller(&text, "memory") {
        Ok(())
    } else {
        Err(format!(
            "the memory controller is not in {} ({:?})",
            file.display(),
            text.trim()
        ))
    }
}

/// Makes the memory controller available to the children of the v2 cgroup `parent`: when
/// it is not yet and this process is in `parent`, moves it into a leaf of its own first
/// (no process may stay in a cgroup whose children use a controller).
pub(super) fn delegate_memory(tree: &dyn Tree, parent: &Path) -> Result<(), CgroupError> {
    let control = parent.join("cgroup.subtree_control");
    let enabled = tree.read(&control).map_err(|source| CgroupError::Read {
        path: control.clone(),
        source,
    })?;
    if lists_controller(&enabled, "memory") {
        return Ok(());
    }
    let procs_file = parent.join("cgroup.procs");
    let procs = tree
        .read(&procs_file)
        .map(|text| parse_procs(&text))
        .map_err(|source| CgroupError::Read {
            path: procs_file,
            source,
        })?;
    if procs.contains(&std::process::id()) {
        move_into_leaf(tree, parent)?;
    }
    enable_memory_controller(tree, parent)
}

/// Moves this process into its own leaf under `parent`, made for it.
pub(super) fn move_into_leaf(tree: &dyn Tree, parent: &Path) -> Result<(), CgroupError> {
    let leaf = parent.join(owned_dir_name(LEAF_RUN, &Owner::this_process()));
    match tree.mkdir(&leaf) {
        Ok(()) => {}
        // Made by this very process before (its name says so).
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(CgroupError::Create { path: leaf, source }),
    }
    write_value(
        tree,
        &leaf.join("cgroup.procs"),
        &std::process::id().to_string(),
    )?;
    tracing::info!(leaf = %leaf.display(), "moved the driver into a cgroup of its own");
    Ok(())
}

/// Writes `+memory` to `dir/cgroup.subtree_control` unless it is already there.
pub(super) fn enable_memory_controller(tree: &dyn Tree, dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let current = tree.read(&path).map_err(|source| CgroupError::Read {
        path: path.clone(),
        source,
    })?;
    if lists_controller(&current, "memory") {
        return Ok(());
    }
    match tree.write(&path, "+memory") {
        Ok(()) => Ok(()),
        Err(source) if source.raw_os_error() == Some(Errno::EBUSY as i32) => {
            let others = tree
                .read(&dir.join("cgroup.procs"))
                .map(|text| parse_procs(&text).len())
                .unwrap_or(0);
            Err(CgroupError::ControllerBusy {
                path: dir.to_path_buf(),
                others,
                source,
            })
        }
        Err(source) => Err(CgroupError::Write {
            path,
            value: "+memory".to_owned(),
            source,
        }),
    }
}

pub(super) fn limit_v1(tree: &dyn Tree, dir: &Path, limit: u64) -> Result<(), CgroupError> {
    let value = limit.to_string();
    write_value(tree, &dir.join("memory.limit_in_bytes"), &value)?;
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if tree.exists(&memsw) {
        write_value(tree, &memsw, &value)?;
    }
    Ok(())
}

pub(super) fn limit_v2(tree: &dyn Tree, dir: &Path, limit: u64) -> Result<(), CgroupError> {
    write_value(tree, &dir.join("memory.max"), &limit.to_string())?;
    let swap = dir.join("memory.swap.max");
    if tree.exists(&swap) {
        write_value(tree, &swap, "0")?;
    }
    let group = dir.join("memory.oom.group");
    if tree.exists(&group) {
        write_value(tree, &group, "1")?;
    }
    Ok(())
}

/// Whether a space-separated controller list (`cgroup.controllers`,
/// `cgroup.subtree_control`) names `controller`.
pub(super) fn lists_controller(text: &str, controller: &str) -> bool {
    text.split_whitespace().any(|name| name == controller)
}

/// A run or worker name must be one harmless directory name.
pub(super) fn validate_name(name: &str) -> Result<(), CgroupError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(CgroupError::InvalidName {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_one_plain_directory_are_rejected() {
        for good in ["rank-3", "job_1.2", "a"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a b",
            "a\nb",
            "\u{e9}",
            long.as_str(),
        ] {
            assert!(
                matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert!(lists_controller("cpu memory io\n", "memory"));
        assert!(!lists_controller("cpu memoryx\n", "memory"));
    }
}
