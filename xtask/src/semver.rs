//! `cargo xtask semver` (a step of `cargo xtask ci`): the facade's public API (with everything
//! it re-exports from the `trainyard-*` crates) checked by `cargo semver-checks` against the
//! last release that `RELEASES` names (a git baseline: nothing is published), so that a
//! breaking change the version does not say fails CI. `scripts/semver-env.sh` installs the tool
//! (CI passes it in `TRAINYARD_SEMVER_CHECKS`); without it the step says `SKIP:`, and under
//! `CI=true` fails unless `TRAINYARD_SEMVER_SKIP` says why.

use std::path::Path;
use std::process::Command;

/// The crate whose API programs build on.
const FACADE: &str = "trainyard";

/// The last release `RELEASES` (at `root`) names: its version and commit.
pub(crate) fn last_release(root: &Path) -> Result<(String, String), String> {
    let path = root.join("RELEASES");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_releases(&text)
        .last()
        .cloned()
        .ok_or_else(|| format!("{} names no release", path.display()))
}

/// The releases in `RELEASES`' text, oldest first: `VERSION COMMIT` a line, `#` comments.
fn parse_releases(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// The `cargo-semver-checks` program: `$TRAINYARD_SEMVER_CHECKS`, else the one cargo finds;
/// `None` after a `SKIP:` line when there is none (an error under `CI=true`, unless
/// `TRAINYARD_SEMVER_SKIP` says why).
fn tool() -> Result<Option<String>, String> {
    if let Some(program) = std::env::var("TRAINYARD_SEMVER_CHECKS")
        .ok()
        .filter(|p| !p.is_empty())
    {
        return Ok(Some(program));
    }
    let found = Command::new("cargo-semver-checks")
        .args(["semver-checks", "--version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return Ok(Some("cargo-semver-checks".to_owned()));
    }
    skip("cargo-semver-checks is not installed (scripts/semver-env.sh installs it and prints it for TRAINYARD_SEMVER_CHECKS)")
        .map(|()| None)
}

/// Says why the check skips (what CI said in `TRAINYARD_SEMVER_SKIP`, else `why`); an error
/// instead under `CI=true` when CI did not say why.
fn skip(why: &str) -> Result<(), String> {
    let reason = std::env::var("TRAINYARD_SEMVER_SKIP").unwrap_or_default();
    if std::env::var("CI").as_deref() == Ok("true") && reason.is_empty() {
        return Err(format!(
            "the API check against the last release cannot run: {why}; CI did not say why (TRAINYARD_SEMVER_SKIP)"
        ));
    }
    eprintln!(
        "SKIP: the API check against the last release: {}",
        if reason.is_empty() { why } else { &reason }
    );
    Ok(())
}

/// Runs the check.
pub(crate) fn run(root: &Path) -> Result<(), String> {
    let (version, rev) = last_release(root)?;
    let Some(tool) = tool()? else {
        return Ok(());
    };
    let present = Command::new("git")
        .args(["cat-file", "-e", &format!("{rev}^{{commit}}")])
        .current_dir(root)
        .status()
        .is_ok_and(|status| status.success());
    if !present {
        return skip(&format!(
            "release {version}'s commit {rev} is not in this clone (a shallow clone?)"
        ));
    }
    eprintln!("$ {tool} semver-checks --package {FACADE} --baseline-rev {rev} (release {version})");
    let status = Command::new(&tool)
        .args(["semver-checks", "check-release", "--package", FACADE])
        .args(["--baseline-rev", &rev, "--all-features"])
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "the API changed in a way the workspace's version does not say against release {version} ({rev}): raise the version (CHANGELOG.md says why), or keep the old item one release as #[deprecated]"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_release_is_the_last_line_that_names_one() {
        let text = "# version commit\n0.1.0 abc\n\n0.2.0 def # the next\n";
        assert_eq!(
            parse_releases(text),
            [
                ("0.1.0".to_owned(), "abc".to_owned()),
                ("0.2.0".to_owned(), "def".to_owned())
            ]
        );
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the repository");
        let (version, rev) = last_release(root).expect("RELEASES names one");
        assert!(version.starts_with("0."), "{version}");
        assert_eq!(rev.len(), 40, "a whole commit id: {rev}");
    }
}
