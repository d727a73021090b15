//! The values on `trainyard run`'s command line that may be secret — `--env K=V`'s values and
//! the `--notify` URL (a webhook's token lives in its path) — found in one place for the
//! places that must keep them off a command line, which every user of the machine may read in
//! `/proc/PID/cmdline`: the run's record shows the command without them, and a driver started
//! again (in the background by `--detach`, or as a Slurm batch job) gets them in its
//! environment instead: the `--env` values in one variable of trainyard's own,
//! [`ENV_VALUES_VAR`] (so that a `--env HOME=...` meant for the workers never changes the
//! driver's own `HOME`), which `--env K` reads first; the webhook in [`NOTIFY_VAR`].
//!
//! Only trainyard's own words are looked at: the program's (`args.program`, the command
//! line's tail) are its own and kept as they are.

use std::ffi::OsString;

/// Where `trainyard run` takes the `--notify` URL from when the flag is not given.
pub(crate) const NOTIFY_VAR: &str = "TRAINYARD_NOTIFY";

/// Where a driver started by another program finds the `--env` values its command line names
/// by key alone: one JSON object of them. The background driver of `--detach` and a Slurm
/// `--detach` job are given it; so is the driver Python's `TorchTrainer.fit()` starts.
pub(crate) const ENV_VALUES_VAR: &str = "TRAINYARD_ENV_VALUES";

/// The value of `key` that this driver was handed in [`ENV_VALUES_VAR`], if any.
pub(crate) fn env_value(key: &str) -> Option<String> {
    let handed = std::env::var(ENV_VALUES_VAR).ok()?;
    let values: std::collections::BTreeMap<String, String> = serde_json::from_str(&handed).ok()?;
    values.get(key).cloned()
}

/// A secret value among the command line's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Secret {
    /// The word that holds it.
    index: usize,
    /// `--env` or `--notify`.
    flag: &'static str,
    /// Whether the word is `--flag=VALUE` (else it is the value alone, after the flag).
    joined: bool,
}

/// The secret values among `words` (the whole command line, the binary first), of which the
/// last `program` are the program's.
fn secrets(words: &[&str], program: usize) -> Vec<Secret> {
    let own = words.len().saturating_sub(program);
    let mut found = Vec::new();
    let mut index = 0;
    while index < own {
        let word = words[index];
        for flag in ["--env", "--notify"] {
            if word == flag && index + 1 < own {
                found.push(Secret {
                    index: index + 1,
                    flag,
                    joined: false,
                });
                index += 1;
            } else if word
                .strip_prefix(flag)
                .is_some_and(|rest| rest.starts_with('='))
            {
                found.push(Secret {
                    index,
                    flag,
                    joined: true,
                });
            }
        }
        index += 1;
    }
    found
}

/// The command line as the run's record keeps it: each `--env K=V` as `K=…`, each `--notify`
/// URL as its scheme and host.
pub(crate) fn recorded(words: &[String], program: usize) -> Vec<String> {
    let plain: Vec<&str> = words.iter().map(String::as_str).collect();
    let mut out = words.to_vec();
    for secret in secrets(&plain, program) {
        let word = &words[secret.index];
        out[secret.index] = if secret.joined {
            let (flag, value) = word.split_once('=').unwrap_or((word, ""));
            format!("{flag}={}", hidden(secret.flag, value))
        } else {
            hidden(secret.flag, word)
        };
    }
    out
}

/// `value` of `flag` with what may be secret left out.
fn hidden(flag: &str, value: &str) -> String {
    match flag {
        "--env" => match value.split_once('=') {
            Some((key, _)) => format!("{key}=…"),
            None => value.to_owned(),
        },
        _ => match reqwest::Url::parse(value) {
            Ok(url) => format!(
                "{}://{}/…",
                url.scheme(),
                url.host_str().unwrap_or_default()
            ),
            Err(_) => "…".to_owned(),
        },
    }
}

/// The command line `words` (the binary first) for a driver started again, and the
/// environment that carries what it leaves out: `--env K=V` becomes `--env K` with `K: V` in
/// [`ENV_VALUES_VAR`], and `--notify URL` goes, with [`NOTIFY_VAR`]`=URL` in the
/// environment.
pub(crate) fn passed_on(
    words: &[OsString],
    program: usize,
) -> (Vec<OsString>, Vec<(OsString, OsString)>) {
    let plain: Vec<String> = words
        .iter()
        .map(|word| word.to_string_lossy().into_owned())
        .collect();
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let mut out: Vec<Option<OsString>> = words.iter().cloned().map(Some).collect();
    let mut env = Vec::new();
    let mut values = std::collections::BTreeMap::new();
    for secret in secrets(&plain, program) {
        // A word that is not UTF-8 is left as it is: it cannot be split safely.
        let Some(word) = words[secret.index].to_str() else {
            continue;
        };
        let value = if secret.joined {
            word.split_once('=').map_or("", |(_, value)| value)
        } else {
            word
        };
        match secret.flag {
            "--env" => {
                let Some((key, val)) = value.split_once('=') else {
                    continue;
                };
                values.insert(key.to_owned(), val.to_owned());
                out[secret.index] = Some(if secret.joined {
                    OsString::from(format!("--env={key}"))
                } else {
                    OsString::from(key)
                });
            }
            _ => {
                env.push((OsString::from(NOTIFY_VAR), OsString::from(value)));
                out[secret.index] = None;
                if !secret.joined {
                    out[secret.index - 1] = None;
                }
            }
        }
    }
    if !values.is_empty() {
        let values = serde_json::to_string(&values).unwrap_or_default();
        env.push((OsString::from(ENV_VALUES_VAR), OsString::from(values)));
    }
    (out.into_iter().flatten().collect(), env)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    /// Whether `word` holds one of the secret values of [`WORDS`].
    fn is_secret(word: &OsStr) -> bool {
        word.to_str()
            .is_some_and(|word| word.contains("s3cret") || word.contains("/T000/"))
    }

    const WORDS: [&str; 13] = [
        "trainyard",
        "run",
        "--env",
        "TOKEN=s3cret",
        "--env=KEY=s3cret2",
        "--env",
        "FROM_ENV",
        "--notify",
        "https://hooks.example.com/T000/B000/xyz?key=1",
        "--",
        "python",
        "--env",
        "A=b",
    ];

    #[test]
    fn the_recorded_command_leaves_out_env_values_and_webhook_paths_but_not_the_program() {
        let words: Vec<String> = WORDS.iter().map(|w| (*w).to_owned()).collect();
        assert_eq!(
            recorded(&words, 3),
            [
                "trainyard",
                "run",
                "--env",
                "TOKEN=…",
                "--env=KEY=…",
                "--env",
                "FROM_ENV",
                "--notify",
                "https://hooks.example.com/…",
                "--",
                "python",
                "--env",
                "A=b",
            ]
        );
    }

    #[test]
    fn a_driver_started_again_gets_the_secrets_in_its_environment_not_its_arguments() {
        let words: Vec<OsString> = WORDS.iter().map(OsString::from).collect();
        let (args, env) = passed_on(&words, 3);
        assert_eq!(
            args,
            [
                "trainyard",
                "run",
                "--env",
                "TOKEN",
                "--env=KEY",
                "--env",
                "FROM_ENV",
                "--",
                "python",
                "--env",
                "A=b"
            ]
        );
        assert!(!args.iter().any(|word| is_secret(word)), "{args:?}");
        assert_eq!(
            env,
            [
                (
                    NOTIFY_VAR.into(),
                    "https://hooks.example.com/T000/B000/xyz?key=1".into()
                ),
                (
                    ENV_VALUES_VAR.into(),
                    r#"{"KEY":"s3cret2","TOKEN":"s3cret"}"#.into()
                ),
            ]
        );
    }

    #[test]
    fn the_programs_own_words_are_never_taken_for_trainyards() {
        // torchrun's way: the program starts at its first word, without `--`.
        let words: Vec<OsString> = [
            "trainyard",
            "run",
            "python",
            "--notify",
            "x",
            "--env",
            "A=b",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let (args, env) = passed_on(&words, 5);
        assert_eq!(args, words);
        assert!(env.is_empty());
    }
}
