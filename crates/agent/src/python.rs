//! The Python side the agent carries in its binary: the `trainyard` package (Ray Train's
//! worker API: `from trainyard import train`) and the `trainyard_report` module, written once
//! per user, host and content into a private directory under the temporary directory
//! ([`shared`]; every agent of every run uses it, and Python's byte code cached beside it
//! too) and put first on the `PYTHONPATH` of every command task, so that a script imports the
//! copy that speaks this agent's report protocol, with nothing installed. Where that
//! directory cannot be trusted (it is not this user's own and private), each agent writes
//! the files into its own private directory instead ([`crate::workdir`]).
//!
//! A binary installed from the Python wheel has the same package installed beside it (one
//! wheel, one version): its tasks import that one ([`installed_beside`]), with what the wheel
//! brought along (cloudpickle), and nothing is put on their `PYTHONPATH`.

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The variable Python searches for modules in.
pub(crate) const PYTHONPATH: &str = "PYTHONPATH";

/// The carried files: each one's path under the directory put on `PYTHONPATH`, and its text.
pub(crate) const FILES: &[(&str, &str)] = &[
    (
        "trainyard/__init__.py",
        include_str!("../../../python/trainyard/__init__.py"),
    ),
    (
        "trainyard/__main__.py",
        include_str!("../../../python/trainyard/__main__.py"),
    ),
    (
        "trainyard/_client.py",
        include_str!("../../../python/trainyard/_client.py"),
    ),
    (
        "trainyard/_driver.py",
        include_str!("../../../python/trainyard/_driver.py"),
    ),
    (
        "trainyard/_events.py",
        include_str!("../../../python/trainyard/_events.py"),
    ),
    (
        "trainyard/_find_trainyard.py",
        include_str!("../../../python/trainyard/_find_trainyard.py"),
    ),
    (
        "trainyard/_fit.py",
        include_str!("../../../python/trainyard/_fit.py"),
    ),
    (
        "trainyard/_validate.py",
        include_str!("../../../python/trainyard/_validate.py"),
    ),
    (
        "trainyard/_warm.py",
        include_str!("../../../python/trainyard/_warm.py"),
    ),
    (
        "trainyard/_worker.py",
        include_str!("../../../python/trainyard/_worker.py"),
    ),
    (
        "trainyard/train/__init__.py",
        include_str!("../../../python/trainyard/train/__init__.py"),
    ),
    (
        "trainyard/train/_callback.py",
        include_str!("../../../python/trainyard/train/_callback.py"),
    ),
    (
        "trainyard/train/_checkpoint.py",
        include_str!("../../../python/trainyard/train/_checkpoint.py"),
    ),
    (
        "trainyard/train/_config.py",
        include_str!("../../../python/trainyard/train/_config.py"),
    ),
    (
        "trainyard/train/_context.py",
        include_str!("../../../python/trainyard/train/_context.py"),
    ),
    (
        "trainyard/train/_local.py",
        include_str!("../../../python/trainyard/train/_local.py"),
    ),
    (
        "trainyard/train/_preemption.py",
        include_str!("../../../python/trainyard/train/_preemption.py"),
    ),
    (
        "trainyard/train/_report_config.py",
        include_str!("../../../python/trainyard/train/_report_config.py"),
    ),
    (
        "trainyard/train/_reported.py",
        include_str!("../../../python/trainyard/train/_reported.py"),
    ),
    (
        "trainyard/train/_result.py",
        include_str!("../../../python/trainyard/train/_result.py"),
    ),
    (
        "trainyard/train/_validation.py",
        include_str!("../../../python/trainyard/train/_validation.py"),
    ),
    (
        "trainyard/train/collective.py",
        include_str!("../../../python/trainyard/train/collective.py"),
    ),
    (
        "trainyard/train/huggingface/__init__.py",
        include_str!("../../../python/trainyard/train/huggingface/__init__.py"),
    ),
    (
        "trainyard/train/huggingface/transformers/__init__.py",
        include_str!("../../../python/trainyard/train/huggingface/transformers/__init__.py"),
    ),
    (
        "trainyard/train/huggingface/transformers/_transformers_utils.py",
        include_str!(
            "../../../python/trainyard/train/huggingface/transformers/_transformers_utils.py"
        ),
    ),
    (
        "trainyard/train/lightning/__init__.py",
        include_str!("../../../python/trainyard/train/lightning/__init__.py"),
    ),
    (
        "trainyard/train/lightning/_lightning_utils.py",
        include_str!("../../../python/trainyard/train/lightning/_lightning_utils.py"),
    ),
    (
        "trainyard/train/torch/__init__.py",
        include_str!("../../../python/trainyard/train/torch/__init__.py"),
    ),
    (
        "trainyard_report.py",
        include_str!("../../../python/trainyard_report.py"),
    ),
];

/// Writes the carried files under `dir`.
///
/// # Errors
/// The first file or folder that cannot be written.
pub(crate) fn write(dir: &Path) -> std::io::Result<()> {
    for (name, text) in FILES {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            trainyard_sys::private::dir_all(parent)?;
        }
        trainyard_sys::private::write(&path, text.as_bytes())?;
    }
    Ok(())
}

/// What the shared directory's name starts with.
const SHARED_PREFIX: &str = "trainyard-python-";

/// The directory every agent of this user on this host puts on its tasks' `PYTHONPATH`:
/// `trainyard-python-<uid>-<digest of the carried files>` under the temporary directory,
/// written whole on first use (into a private folder of its own, then renamed into place, so
/// that no agent ever sees it half written) and used as it is after that. It is trusted only
/// while it is a directory (not a link) owned by this user that nobody else may enter
/// (`0700`), as `tmux` trusts its socket directory: then only this user can have written it.
///
/// # Errors
/// When the directory cannot be written, or one of that name is there but not this user's
/// own and private.
pub(crate) fn shared() -> std::io::Result<PathBuf> {
    shared_under(&std::env::temp_dir())
}

/// [`shared`], under `base`.
fn shared_under(base: &Path) -> std::io::Result<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = base.join(format!("{SHARED_PREFIX}{uid}-{:016x}", digest()));
    if !dir.exists() {
        let staging = trainyard_sys::private::temp_dir_in(base, &format!(".{SHARED_PREFIX}"))?;
        write(staging.path())?;
        // Another agent may have put its copy in place first: then that one is used.
        if std::fs::rename(staging.path(), &dir).is_ok() {
            std::mem::forget(staging);
        }
    }
    let metadata = std::fs::symlink_metadata(&dir)?;
    if !metadata.is_dir() || metadata.uid() != uid || metadata.mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of this user's own",
                dir.display()
            ),
        ));
    }
    Ok(dir)
}

/// A digest of the carried files: a change to any of them names another directory.
fn digest() -> u64 {
    static DIGEST: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *DIGEST.get_or_init(|| {
        let mut hasher = std::hash::DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        FILES.hash(&mut hasher);
        hasher.finish()
    })
}

/// Puts `dir` first on the `PYTHONPATH` of `env`, before what the task had there. A path that
/// is not UTF-8 cannot be put in the environment: `env` is left as it is then.
pub(crate) fn prepend(env: &mut BTreeMap<String, String>, dir: &Path) {
    let Some(dir) = dir.to_str() else {
        return;
    };
    let path = match env.get(PYTHONPATH).map(String::as_str) {
        // An empty entry would put the current directory on the path.
        None | Some("") => dir.to_owned(),
        Some(existing) => format!("{dir}:{existing}"),
    };
    env.insert(PYTHONPATH.to_owned(), path);
}

/// Whether the `trainyard` package of this very version is installed beside the binary at
/// `exe`: the wheel puts the binary in `PREFIX/bin/` and the package in
/// `PREFIX/lib/pythonX.Y/site-packages/` with its `trainyard-VERSION.dist-info`, for a virtual
/// environment, a `--user` install and a system prefix alike.
#[must_use]
pub(crate) fn installed_beside(exe: &Path) -> bool {
    let Some(lib) = exe.parent().and_then(Path::parent).map(|p| p.join("lib")) else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir(&lib) else {
        return false;
    };
    let dist_info = format!("trainyard-{}.dist-info", env!("CARGO_PKG_VERSION"));
    entries.flatten().any(|entry| {
        entry.file_name().to_string_lossy().starts_with("python")
            && entry.path().join("site-packages").join(&dist_info).is_dir()
    })
}

/// Whether the running binary came from the wheel ([`installed_beside`]).
#[must_use]
pub(crate) fn running_from_wheel() -> bool {
    std::env::current_exe().is_ok_and(|exe| installed_beside(&exe))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// Every `.py` file under `dir`, relative to `root`, sorted.
    fn python_files(root: &Path, dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("python/ is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "__pycache__") {
                    python_files(root, &path, found);
                }
            } else if path.extension().is_some_and(|e| e == "py") {
                let relative = path.strip_prefix(root).expect("under root");
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }

    #[test]
    fn every_module_of_the_package_is_carried() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
        let mut found = vec!["trainyard_report.py".to_owned()];
        python_files(&root, &root.join("trainyard"), &mut found);
        found.sort();
        let mut carried: Vec<String> = FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        carried.sort();
        assert_eq!(carried, found, "python/trainyard and FILES disagree");
    }

    #[test]
    fn the_carried_package_goes_first_on_an_existing_pythonpath() {
        let dir = Path::new("/tmp/agent/python");
        let mut env = BTreeMap::new();
        prepend(&mut env, dir);
        assert_eq!(env[PYTHONPATH], "/tmp/agent/python");
        env.insert(PYTHONPATH.to_owned(), "/mine:/theirs".to_owned());
        prepend(&mut env, dir);
        assert_eq!(env[PYTHONPATH], "/tmp/agent/python:/mine:/theirs");
        env.insert(PYTHONPATH.to_owned(), String::new());
        prepend(&mut env, dir);
        assert_eq!(env[PYTHONPATH], "/tmp/agent/python");
    }

    #[test]
    fn a_binary_with_its_dist_info_beside_it_came_from_the_wheel() {
        let prefix = tempfile::tempdir().expect("a temp dir");
        let exe = prefix.path().join("bin/trainyard");
        std::fs::create_dir_all(exe.parent().expect("bin/")).expect("bin/");
        assert!(!installed_beside(&exe), "no lib/ at all");
        let site = prefix.path().join("lib/python3.11/site-packages");
        let other = site.join("trainyard-0.0.0.dist-info");
        std::fs::create_dir_all(&other).expect("site-packages");
        assert!(!installed_beside(&exe), "another version's package");
        let ours = site.join(format!("trainyard-{}.dist-info", env!("CARGO_PKG_VERSION")));
        std::fs::create_dir_all(ours).expect("dist-info");
        assert!(installed_beside(&exe));
        assert!(!installed_beside(Path::new("/trainyard")), "no prefix");
    }

    #[test]
    fn the_shared_directory_is_written_once_private_and_whole() {
        let base = tempfile::tempdir().expect("a temp dir");
        let dir = shared_under(base.path()).expect("written");
        let mode = std::fs::metadata(&dir).expect("there").mode();
        assert_eq!(mode & 0o777, 0o700, "private");
        for (name, text) in FILES {
            let written = std::fs::read_to_string(dir.join(name)).expect("readable");
            assert_eq!(&written, text, "{name}");
        }
        let marker = dir.join("written-once");
        std::fs::write(&marker, b"").expect("a marker");
        assert_eq!(shared_under(base.path()).expect("there"), dir);
        assert!(marker.exists(), "the directory in place is used as it is");
        let names: Vec<_> = std::fs::read_dir(base.path())
            .expect("readable")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "no staging folder is left: {names:?}");
    }

    #[test]
    fn a_shared_directory_others_may_enter_or_a_link_is_not_used() {
        let base = tempfile::tempdir().expect("a temp dir");
        let uid = nix::unistd::geteuid().as_raw();
        let dir = base
            .path()
            .join(format!("{SHARED_PREFIX}{uid}-{:016x}", digest()));
        std::fs::create_dir(&dir).expect("planted");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = shared_under(base.path()).expect_err("not private");
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{error}"
        );
        std::fs::remove_dir(&dir).expect("removed");
        let elsewhere = tempfile::tempdir().expect("another dir");
        std::os::unix::fs::symlink(elsewhere.path(), &dir).expect("a link");
        assert!(shared_under(base.path()).is_err(), "a link is not followed");
    }

    #[test]
    fn the_files_are_written_as_carried() {
        let dir = tempfile::tempdir().expect("a temp dir");
        write(dir.path()).expect("written");
        for (name, text) in FILES {
            let written = std::fs::read_to_string(dir.path().join(name)).expect("readable");
            assert_eq!(&written, text, "{name}");
        }
    }
}
