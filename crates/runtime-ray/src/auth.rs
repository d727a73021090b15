//! Ray's token authentication, as a client must set it up (Ray 2.60).
//!
//! An explicit-address `ray.init` never turns token auth on by itself: with `RAY_AUTH_MODE`
//! unset it connects without a token and, against a cluster with auth on, retries for 20 s
//! before a `ConnectionError`. So when the mode is unset and a token exists, the bridge gets
//! `RAY_AUTH_MODE=token`. Ray looks for the token in this order: `RAY_AUTH_TOKEN`, the file named
//! by `RAY_AUTH_TOKEN_PATH`, `$HOME/.ray/auth_token`.

use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable that selects Ray's auth mode (`token` or `disabled`).
pub const AUTH_MODE_VAR: &str = "RAY_AUTH_MODE";
/// The environment variable that holds a token.
pub const AUTH_TOKEN_VAR: &str = "RAY_AUTH_TOKEN";
/// The environment variable that names a token file.
pub const AUTH_TOKEN_PATH_VAR: &str = "RAY_AUTH_TOKEN_PATH";

/// Where a token was found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TokenSource {
    /// `RAY_AUTH_TOKEN`.
    EnvVar,
    /// The file named by `RAY_AUTH_TOKEN_PATH`.
    PathVar(PathBuf),
    /// `$HOME/.ray/auth_token`.
    HomeFile(PathBuf),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EnvVar => write!(f, "${AUTH_TOKEN_VAR}"),
            Self::PathVar(path) => write!(f, "${AUTH_TOKEN_PATH_VAR} ({})", path.display()),
            Self::HomeFile(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What a token lookup found, and where it looked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthLookup {
    /// `RAY_AUTH_MODE` as set, if it is.
    pub mode: Option<String>,
    /// The token's source, if one was found.
    pub token: Option<TokenSource>,
    /// Every place looked at, in order, with what was there (for error messages).
    pub looked_at: Vec<String>,
}

impl AuthLookup {
    /// Looks for a token the way Ray does. `var` reads the environment the bridge will get;
    /// `has_token` says whether a file exists and holds a non-blank token. Both are passed in
    /// so the lookup is a pure function.
    pub fn find(var: impl Fn(&str) -> Option<String>, has_token: impl Fn(&Path) -> bool) -> Self {
        let mode = var(AUTH_MODE_VAR).filter(|m| !m.trim().is_empty());
        let mut looked_at = Vec::new();
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let token = if set(AUTH_TOKEN_VAR).is_some() {
            looked_at.push(format!("${AUTH_TOKEN_VAR} (set)"));
            Some(TokenSource::EnvVar)
        } else {
            looked_at.push(format!("${AUTH_TOKEN_VAR} (unset)"));
            if let Some(path) = set(AUTH_TOKEN_PATH_VAR).map(PathBuf::from) {
                // Ray does not fall back to the home file when the path variable is set.
                let found = has_token(&path);
                looked_at.push(format!("${AUTH_TOKEN_PATH_VAR}={}", seen(&path, found)));
                found.then_some(TokenSource::PathVar(path))
            } else {
                looked_at.push(format!("${AUTH_TOKEN_PATH_VAR} (unset)"));
                match var("HOME").filter(|h| !h.is_empty()) {
                    Some(home) => {
                        let path = Path::new(&home).join(".ray").join("auth_token");
                        let found = has_token(&path);
                        looked_at.push(seen(&path, found));
                        found.then_some(TokenSource::HomeFile(path))
                    }
                    None => {
                        looked_at.push("$HOME/.ray/auth_token ($HOME unset)".to_owned());
                        None
                    }
                }
            }
        };
        Self {
            mode,
            token,
            looked_at,
        }
    }

    /// The `RAY_AUTH_MODE` the bridge must be given: `token` when the mode is unset and a token
    /// exists, nothing otherwise (an explicit mode is left as the user set it).
    pub fn mode_to_set(&self) -> Option<&'static str> {
        (self.mode.is_none() && self.token.is_some()).then_some("token")
    }

    /// The places looked at, on one line.
    pub fn describe(&self) -> String {
        let mode = self.mode.as_deref().unwrap_or("unset");
        format!(
            "{AUTH_MODE_VAR}={mode}; looked at {}",
            self.looked_at.join(", ")
        )
    }
}

/// `path (found)` or `path (missing or empty)`.
fn seen(path: &Path, found: bool) -> String {
    let what = if found { "found" } else { "missing or empty" };
    format!("{} ({what})", path.display())
}

/// Whether `path` holds a non-blank token (what [`AuthLookup::find`] needs from the filesystem).
pub fn file_has_token(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| !text.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn lookup(vars: &[(&str, &str)], files: &[&str]) -> AuthLookup {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        AuthLookup::find(
            |name| vars.get(name).cloned(),
            |path| files.iter().any(|f| Path::new(f) == path),
        )
    }

    #[test]
    fn the_env_token_wins_over_the_path_variable_and_the_home_file() {
        let found = lookup(
            &[
                ("RAY_AUTH_TOKEN", "abc"),
                ("RAY_AUTH_TOKEN_PATH", "/t/tok"),
                ("HOME", "/h"),
            ],
            &["/t/tok", "/h/.ray/auth_token"],
        );
        assert_eq!(found.token, Some(TokenSource::EnvVar));
        assert_eq!(found.mode_to_set(), Some("token"));
    }

    #[test]
    fn the_path_variable_wins_over_the_home_file_and_does_not_fall_back() {
        let found = lookup(
            &[("RAY_AUTH_TOKEN_PATH", "/t/tok"), ("HOME", "/h")],
            &["/t/tok", "/h/.ray/auth_token"],
        );
        assert_eq!(found.token, Some(TokenSource::PathVar("/t/tok".into())));
        let missing = lookup(
            &[("RAY_AUTH_TOKEN_PATH", "/t/none"), ("HOME", "/h")],
            &["/h/.ray/auth_token"],
        );
        assert_eq!(missing.token, None);
        assert!(
            missing.describe().contains("/t/none (missing or empty)"),
            "{}",
            missing.describe()
        );
    }

    #[test]
    fn the_home_file_is_used_last_and_a_blank_env_token_counts_as_unset() {
        let found = lookup(
            &[("RAY_AUTH_TOKEN", "  "), ("HOME", "/h")],
            &["/h/.ray/auth_token"],
        );
        assert_eq!(
            found.token,
            Some(TokenSource::HomeFile("/h/.ray/auth_token".into()))
        );
        let none = lookup(&[("HOME", "/h")], &[]);
        assert_eq!(none.token, None);
        assert_eq!(none.mode_to_set(), None);
        assert!(
            none.describe()
                .contains("/h/.ray/auth_token (missing or empty)")
        );
    }

    #[test]
    fn an_explicit_mode_is_never_overridden() {
        let disabled = lookup(
            &[("RAY_AUTH_MODE", "disabled"), ("RAY_AUTH_TOKEN", "x")],
            &[],
        );
        assert_eq!(disabled.mode_to_set(), None);
        assert_eq!(disabled.mode.as_deref(), Some("disabled"));
    }
}
