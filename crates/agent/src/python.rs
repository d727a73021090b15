//! The Python side the agent carries in its binary: the `trainyard` package (Ray Train's
//! worker API: `from trainyard import train`) and the `trainyard_report` module, written once
//! per agent into its private directory ([`crate::workdir`]) and put first on the
//! `PYTHONPATH` of every command task, so that a script imports the copy that speaks this
//! agent's report protocol, with nothing installed.

use std::collections::BTreeMap;
use std::path::Path;

/// The variable Python searches for modules in.
pub(crate) const PYTHONPATH: &str = "PYTHONPATH";

/// The carried files: each one's path under the directory put on `PYTHONPATH`, and its text.
pub(crate) const FILES: &[(&str, &str)] = &[
    (
        "trainyard/__init__.py",
        include_str!("../../../python/trainyard/__init__.py"),
    ),
    (
        "trainyard/_client.py",
        include_str!("../../../python/trainyard/_client.py"),
    ),
    (
        "trainyard/train.py",
        include_str!("../../../python/trainyard/train.py"),
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
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
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
    fn the_files_are_written_as_carried() {
        let dir = tempfile::tempdir().expect("a temp dir");
        write(dir.path()).expect("written");
        for (name, text) in FILES {
            let written = std::fs::read_to_string(dir.path().join(name)).expect("readable");
            assert_eq!(&written, text, "{name}");
        }
    }
}
