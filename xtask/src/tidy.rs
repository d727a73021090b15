//! Layering check: a workspace crate may depend only on crates of lower layers.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// The workspace's crates, lowest layer first. A crate may depend (normal, build or dev) only
/// on crates listed before it, and, through a dev-dependency, on itself: that is how Cargo
/// enables a feature of a crate for its own tests (`testing`).
pub(crate) const LAYERS: &[&str] = &[
    "trainyard-resources",
    "trainyard-sys",
    "trainyard-test-support",
    "trainyard-config",
    "trainyard-checkpoint",
    "trainyard-runtime",
    "trainyard-worker-group",
    "trainyard-backend-executor",
    "trainyard-torch-backend",
    "trainyard-wire",
    "trainyard-hub",
    "trainyard-runtime-local",
    "trainyard-runtime-ray",
    "trainyard-runtime-slurm",
    "trainyard-agent",
    "trainyard",
    "trainyard-cli",
];

/// The agent process sits above the hub and the runtimes, which speak to it only through
/// `trainyard-wire` and `trainyard-sys`; their tests may still link it (a test binary or
/// example that serves as an agent), through a dev-dependency.
pub(crate) const AGENT: &str = "trainyard-agent";

/// Third-party crates the leaf may use: it is types only.
pub(crate) const LEAF_ALLOWED: &[&str] = &["serde", "serde_json", "thiserror"];

/// One workspace package: its name and its dependencies' names (with the kind of edge).
#[derive(Debug, Clone)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) deps: Vec<(String, String)>,
}

/// Every problem with the layering of `packages`.
pub(crate) fn problems(packages: &[Package]) -> Vec<String> {
    let rank: BTreeMap<&str, usize> = LAYERS.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let members: Vec<&str> = packages.iter().map(|p| p.name.as_str()).collect();
    let mut out = Vec::new();
    for package in packages.iter().filter(|p| p.name != "xtask") {
        let Some(&own) = rank.get(package.name.as_str()) else {
            out.push(format!(
                "`{}` is not in xtask's LAYERS: add it at its layer",
                package.name
            ));
            continue;
        };
        for (dep, kind) in &package.deps {
            if (*dep == package.name || dep == AGENT) && kind == "dev" {
                continue;
            }
            match rank.get(dep.as_str()) {
                Some(&theirs) if theirs >= own => out.push(format!(
                    "`{}` has a {kind} dependency on `{dep}`, which is not below it (layers point down only)",
                    package.name
                )),
                None if members.contains(&dep.as_str()) => {
                    out.push(format!("`{}` depends on `{dep}`, which is not in LAYERS", package.name));
                }
                None if package.name == LAYERS[0] && kind == "normal" && !LEAF_ALLOWED.contains(&dep.as_str()) => {
                    out.push(format!(
                        "the leaf `{}` depends on `{dep}`; it may use only {}",
                        package.name,
                        LEAF_ALLOWED.join(", ")
                    ));
                }
                _ => {}
            }
        }
    }
    out
}

/// Reads the workspace with `cargo metadata` and checks it.
pub(crate) fn check_workspace() -> Result<(), Vec<String>> {
    let packages = workspace_packages().map_err(|e| vec![e])?;
    let problems = problems(&packages);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn workspace_packages() -> Result<Vec<Package>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata output: {e}"))?;
    let packages = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    Ok(packages
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap_or_default().to_owned(),
            deps: p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    let name = d["name"].as_str().unwrap_or_default().to_owned();
                    let kind = d["kind"].as_str().unwrap_or("normal").to_owned();
                    (name, kind)
                })
                .collect(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(name: &str, deps: &[(&str, &str)]) -> Package {
        Package {
            name: name.to_owned(),
            deps: deps
                .iter()
                .map(|(d, k)| ((*d).to_owned(), (*k).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn workspace_dependencies_point_down_only() {
        if let Err(problems) = check_workspace() {
            panic!("layering problems:\n{}", problems.join("\n"));
        }
    }

    #[test]
    fn an_upward_edge_is_reported() {
        let packages = [
            package("trainyard-resources", &[("serde", "normal")]),
            package("trainyard-config", &[("trainyard-resources", "normal")]),
            package("trainyard-runtime", &[("trainyard-config", "normal")]),
        ];
        assert!(problems(&packages).is_empty());
        let upward = [package("trainyard-config", &[("trainyard-runtime", "dev")])];
        let found = problems(&upward);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("dev dependency on `trainyard-runtime`"),
            "{found:?}"
        );
    }

    #[test]
    fn a_dev_dependency_on_itself_enables_features_and_is_no_edge() {
        let own = [package("trainyard-config", &[("trainyard-config", "dev")])];
        assert!(problems(&own).is_empty());
        let normal = [package(
            "trainyard-config",
            &[("trainyard-config", "normal")],
        )];
        assert_eq!(problems(&normal).len(), 1);
    }

    #[test]
    fn runtimes_reach_the_agent_only_from_their_tests() {
        let tests = [package("trainyard-hub", &[("trainyard-agent", "dev")])];
        assert!(problems(&tests).is_empty());
        let linked = [package("trainyard-hub", &[("trainyard-agent", "normal")])];
        let found = problems(&linked);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("normal dependency on `trainyard-agent`"));
    }

    /// A crate of its own under `target/`, linted with the workspace's `clippy.toml`: a
    /// private folder or file made without `trainyard_sys::private` fails the lint, naming
    /// what to use instead.
    #[test]
    fn a_folder_or_file_made_outside_the_private_module_fails_the_lint() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the repository")
            .to_path_buf();
        let probe = root.join("target/lint-probe");
        std::fs::create_dir_all(probe.join("src")).expect("made");
        std::fs::write(
            probe.join("Cargo.toml"),
            "[package]\nname = \"lint-probe\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n[workspace]\n\n[dependencies]\ntempfile = \"3\"\n",
        )
        .expect("written");
        // The workspace's lock: the same tempfile, found offline.
        std::fs::copy(root.join("Cargo.lock"), probe.join("Cargo.lock")).expect("copied");
        std::fs::write(
            probe.join("src/lib.rs"),
            "//! A new feature's scratch folder and output file.\n\n/// Scratch.\npub fn scratch() -> std::io::Result<tempfile::TempDir> {\n    tempfile::tempdir()\n}\n\n/// Output.\npub fn output(path: &std::path::Path) -> std::io::Result<()> {\n    std::fs::write(path, b\"x\")\n}\n",
        )
        .expect("written");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(cargo)
            .args(["clippy", "--offline", "--quiet", "--manifest-path"])
            .arg(probe.join("Cargo.toml"))
            .args(["--", "-D", "clippy::disallowed_methods"])
            .env("CLIPPY_CONF_DIR", &root)
            .env("CARGO_TARGET_DIR", probe.join("target"))
            .output()
            .expect("cargo clippy runs");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the lint let it through: {said}");
        for wanted in [
            "use of a disallowed method `tempfile::tempdir`",
            "make private folders with trainyard_sys::private::temp_dir",
            "use of a disallowed method `std::fs::write`",
        ] {
            assert!(said.contains(wanted), "`{wanted}` not in: {said}");
        }
    }

    #[test]
    fn the_leaf_stays_types_only_and_new_crates_must_be_placed() {
        let heavy = [package(
            "trainyard-resources",
            &[("tokio", "normal"), ("proptest", "dev")],
        )];
        let found = problems(&heavy);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("tokio"));
        let unknown = [package("trainyard-extra", &[])];
        assert!(problems(&unknown)[0].contains("not in xtask's LAYERS"));
    }
}
