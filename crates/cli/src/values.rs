//! The flags' values, typed: one parser for each kind of value (a number of seconds, a
//! duration, a size, a count, a rank list, a checkpoint score, Slurm's forms, anything with a
//! `FromStr`), each given to clap as the flag's `value_parser`. A refused value reads as
//! every bad flag reads: `invalid value `V` for `--FLAG`: WHY` ([`FlagError`]), once
//! [`refused_value`] has turned clap's error back into it.

use std::collections::BTreeSet;
use std::error::Error;
use std::str::FromStr;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use trainyard_config::resources::{ByteSize, ErrorChain};
use trainyard_config::{NumWorkers, ScoreOrder, parse_hang_timeout, parse_resize_interval};

use crate::Failure;

/// A flag whose value is not acceptable. The value is shown as given: every failure is made
/// inert (one line, no control character) once, where it is printed (`crate::failed`).
#[derive(Debug, thiserror::Error)]
#[error("invalid value `{value}` for `{flag}`")]
pub(crate) struct FlagError {
    flag: String,
    value: String,
    #[source]
    source: Box<dyn Error + Send + Sync>,
}

impl FlagError {
    pub(crate) fn new(
        flag: &str,
        value: &str,
    ) -> impl FnOnce(Box<dyn Error + Send + Sync>) -> Self + use<> {
        let flag = flag.to_owned();
        let value = value.to_owned();
        move |source| Self {
            flag,
            value,
            source,
        }
    }
}

/// Why a value parser refused a flag's value. clap keeps it as its error's source, for
/// [`refused_value`] to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Said after the flag and its value, as a [`FlagError`].
    Value(String),
    /// Said on its own: it names the field and the value itself (`num_workers`, the resize
    /// interval), as a config file's value is refused.
    Field(String),
}

impl Refusal {
    /// A refusal said after the flag and its value.
    fn value(why: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self::Value(ErrorChain(why.into().as_ref()).to_string())
    }

    /// A refusal that names the field and the value itself.
    fn field(why: &(dyn Error + 'static)) -> Self {
        Self::Field(ErrorChain(why).to_string())
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Value(why) | Self::Field(why) => f.write_str(why),
        }
    }
}

impl Error for Refusal {}

/// clap's error for a value that one of these parsers refused, as the command's failure
/// (exit 2) that says it as every bad flag is said; `None` for any other error of clap's.
pub(crate) fn refused_value(error: &clap::Error) -> Option<Failure> {
    if error.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let refusal = Error::source(error)?.downcast_ref::<Refusal>()?;
    let context = |kind| match error.get(kind) {
        Some(ContextValue::String(text)) => Some(text.as_str()),
        _ => None,
    };
    Some(Failure::bad_input(match refusal {
        Refusal::Field(why) => why.clone().into(),
        Refusal::Value(why) => {
            // clap names the flag with its value's name: `--hang-timeout <DURATION>`.
            let flag = context(ContextKind::InvalidArg)?.split(' ').next()?;
            let value = context(ContextKind::InvalidValue)?;
            Box::new(FlagError::new(flag, value)(why.clone().into()))
                as Box<dyn Error + Send + Sync>
        }
    }))
}

/// Any value that parses from text, refused with its parser's own error (`--resume`,
/// `--progress`, `--memory`, `-r`, `-s`).
pub(crate) fn parsed<T>(text: &str) -> Result<T, Refusal>
where
    T: FromStr,
    T::Err: Error + Send + Sync + 'static,
{
    text.parse().map_err(Refusal::value)
}

/// `-n`: a number of workers or an elastic range `MIN:MAX`.
pub(crate) fn num_workers(text: &str) -> Result<NumWorkers, Refusal> {
    text.parse().map_err(|error| Refusal::field(&error))
}

/// A positive number of seconds, fractions allowed (`--placement-timeout`).
pub(crate) fn seconds(text: &str) -> Result<Duration, Refusal> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| Refusal::value("expected a positive number of seconds"))
}

/// `--hang-timeout`: a positive duration with units (`90s`, `10m`) or in seconds.
pub(crate) fn hang_timeout(text: &str) -> Result<Duration, Refusal> {
    parse_hang_timeout(text).map_err(Refusal::value)
}

/// `--resize-interval`: a positive duration with units (`30s`, `5m`) or in seconds.
pub(crate) fn resize_interval(text: &str) -> Result<Duration, Refusal> {
    parse_resize_interval(text).map_err(|error| Refusal::field(&error))
}

/// `--warm-python`: the modules a warm Python imports first, comma-separated
/// (`torch,numpy`); each a dotted Python name.
pub(crate) fn module_list(text: &str) -> Result<ModuleList, Refusal> {
    let modules: Vec<String> = text.split(',').map(|m| m.trim().to_owned()).collect();
    let is_name = |part: &str| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
            && chars.all(|c| c == '_' || c.is_alphanumeric())
    };
    match modules.iter().find(|m| !m.split('.').all(is_name)) {
        Some(bad) => Err(Refusal::value(format!(
            "`{bad}` is not a Python module name: expected names such as torch or torch.distributed, comma-separated"
        ))),
        None => Ok(ModuleList(modules)),
    }
}

/// The modules of [`module_list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModuleList(pub(crate) Vec<String>);

/// A whole number of at least 1 (`--checkpoints-to-keep`).
pub(crate) fn at_least_one(text: &str) -> Result<u32, Refusal> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| Refusal::value("expected a whole number of at least 1"))
}

/// A size of more than 0 bytes, such as 20GB (`--max-checkpoint-size`).
pub(crate) fn positive_size(text: &str) -> Result<ByteSize, Refusal> {
    text.parse::<ByteSize>()
        .ok()
        .filter(|size| size.bytes() > 0)
        .ok_or_else(|| Refusal::value("expected a positive size such as 20GB or 512MiB"))
}

/// `--checkpoint-score`: the reported metric that ranks checkpoints, and which way is better.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckpointScore {
    /// The metric's name.
    pub(crate) attribute: String,
    /// Whether more or less is better.
    pub(crate) order: ScoreOrder,
}

/// `ATTR[:min|max]`, the order `max` unless given.
pub(crate) fn checkpoint_score(text: &str) -> Result<CheckpointScore, Refusal> {
    let (attribute, order) = match text.rsplit_once(':') {
        Some((attribute, order)) => (attribute, order.parse::<ScoreOrder>()),
        None => (text, Ok(ScoreOrder::Max)),
    };
    let order = order.map_err(Refusal::value)?;
    if attribute.trim().is_empty() {
        return Err(Refusal::value(
            "expected a metric's name, optionally followed by :min or :max (loss:min)",
        ));
    }
    Ok(CheckpointScore {
        attribute: attribute.trim().to_owned(),
        order,
    })
}

/// `--ranks`: rank numbers and ranges (`0`, `0,2-3`) as written; which of them exist depends
/// on the number of workers ([`within`](Self::within)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankList {
    /// The flag's value.
    text: String,
    /// Each part as written, with its first and last rank (the same for one rank).
    parts: Vec<(String, u32, u32)>,
}

/// Rank numbers and ranges, separated by commas.
pub(crate) fn rank_list(text: &str) -> Result<RankList, Refusal> {
    let rank = |part: &str| {
        part.trim().parse::<u32>().map_err(|_| {
            Refusal::value(format!(
                "expected rank numbers or ranges such as 0 or 0,2-3; `{part}` is not a rank"
            ))
        })
    };
    let parts = text
        .split(',')
        .map(|part| {
            let (first, last) = match part.split_once('-') {
                Some((first, last)) => (rank(first)?, rank(last)?),
                None => {
                    let n = rank(part)?;
                    (n, n)
                }
            };
            Ok((part.to_owned(), first, last))
        })
        .collect::<Result<_, Refusal>>()?;
    Ok(RankList {
        text: text.to_owned(),
        parts,
    })
}

impl RankList {
    /// The ranks listed, each of which must be below `num_workers`, and each range not
    /// empty.
    pub(crate) fn within(&self, num_workers: u32) -> Result<BTreeSet<u32>, FlagError> {
        self.within_for("--ranks", num_workers)
    }

    /// [`Self::within`], for the flag `flag`.
    pub(crate) fn within_for(
        &self,
        flag: &str,
        num_workers: u32,
    ) -> Result<BTreeSet<u32>, FlagError> {
        let bad = |reason: String| FlagError::new(flag, &self.text)(reason.into());
        let exists = |n: u32| {
            if n >= num_workers {
                return Err(bad(format!(
                    "rank {n} does not exist: the run has {num_workers} worker{} (ranks 0-{})",
                    if num_workers == 1 { "" } else { "s" },
                    num_workers.saturating_sub(1)
                )));
            }
            Ok(n)
        };
        let mut ranks = BTreeSet::new();
        for (part, first, last) in &self.parts {
            let (first, last) = (exists(*first)?, exists(*last)?);
            if first > last {
                return Err(bad(format!(
                    "the range {part} is empty: write the lower rank first"
                )));
            }
            ranks.extend(first..=last);
        }
        Ok(ranks)
    }
}

/// `--storage`: a path, `file:///PATH` or `s3://BUCKET[/PREFIX]`, as given.
pub(crate) fn storage_location(text: &str) -> Result<String, Refusal> {
    text.parse::<trainyard::checkpoint::StorageLocation>()
        .map(|_| text.to_owned())
        .map_err(Refusal::value)
}

/// `--notify`: an `http://` or `https://` URL, as given.
pub(crate) fn notify_url(text: &str) -> Result<String, Refusal> {
    http_url(text, "expected an http:// or https:// URL")
}

/// `--env-from-driver`: a variable's name, or a prefix ending in `*` (`WANDB_*`).
pub(crate) fn env_pattern(text: &str) -> Result<String, Refusal> {
    let name = text.strip_suffix('*').unwrap_or(text);
    if name.is_empty() || name.contains(['*', '=']) {
        return Err(Refusal::value(
            "expected a variable name, or a prefix ending in `*` such as `WANDB_*`",
        ));
    }
    Ok(text.to_owned())
}

/// `text` when it is an `http://` or `https://` URL with a host; `why` otherwise.
fn http_url(text: &str, why: &'static str) -> Result<String, Refusal> {
    reqwest::Url::parse(text)
        .ok()
        .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
        .map(|_| text.to_owned())
        .ok_or_else(|| Refusal::value(why))
}

/// `--mlflow`: an `http://` or `https://` URL of a tracking server.
pub(crate) fn mlflow_uri(text: &str) -> Result<String, Refusal> {
    http_url(
        text,
        "expected an MLflow tracking server's http:// or https:// URL",
    )
}

/// `--env`: `KEY=VALUE` with a non-empty key, or `KEY` alone for the value `KEY` has in this
/// process's environment (a secret kept off the command line).
pub(crate) fn env_pair(text: &str) -> Result<(String, String), Refusal> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        None if !text.is_empty() => crate::secrets::env_value(text)
            .map_or_else(|| std::env::var(text), Ok)
            .map(|value| (text.to_owned(), value))
            .map_err(|_| {
                Refusal::value(
                    "expected KEY=VALUE, or a KEY set in this environment (its value is taken from there); this KEY is not set",
                )
            }),
        _ => Err(Refusal::value(
            "expected KEY=VALUE with a non-empty KEY, or a KEY set in this environment",
        )),
    }
}

/// The variables of `--env-file FILE`: one `KEY=VALUE` a line (the value as it is, quotes
/// included), or `KEY` alone for its value in this environment, as `--env` takes them; blank
/// lines and lines starting with `#` are passed over.
pub(crate) fn env_file(path: &std::path::Path) -> Result<Vec<(String, String)>, FlagError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| {
        FlagError::new("--env-file", &shown)(format!("cannot be read: {error}").into())
    })?;
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // The line itself is not shown: its value may be secret.
        let pair = env_pair(line.trim_end_matches('\r')).map_err(|refusal| {
            FlagError::new("--env-file", &shown)(format!("line {}: {refusal}", number + 1).into())
        })?;
        pairs.push(pair);
    }
    Ok(pairs)
}

/// One Slurm name, without spaces or commas (`--partition`, `--account`, `--qos`).
pub(crate) fn slurm_name(text: &str) -> Result<String, Refusal> {
    if text.is_empty() || text.contains(|c: char| c.is_whitespace() || c == ',') {
        return Err(Refusal::value(
            "expected one Slurm name, without spaces or commas",
        ));
    }
    Ok(text.to_owned())
}

/// `--time`: a time limit in Slurm's forms: `MINUTES`, `MM:SS`, `H:MM:SS`, `D-HH`,
/// `D-HH:MM`, `D-HH:MM:SS`, `UNLIMITED`/`INFINITE`.
pub(crate) fn slurm_time(text: &str) -> Result<String, Refusal> {
    if !is_slurm_time(text) {
        return Err(Refusal::value(
            "expected a Slurm time limit: MINUTES, MM:SS, H:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
        ));
    }
    Ok(text.to_owned())
}

/// `--signal`: `[R:|B:]SIGNAL[@SECONDS]`, the signal a name (`USR1`, `SIGUSR1`) or a
/// number.
pub(crate) fn slurm_signal(text: &str) -> Result<String, Refusal> {
    if !is_slurm_signal(text) {
        return Err(Refusal::value(
            "expected SIGNAL[@SECONDS] such as USR1@90 (a signal name or number, seconds up to 65535)",
        ));
    }
    Ok(text.to_owned())
}

/// `MINUTES`, `MM:SS`, `H:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, `UNLIMITED`/`INFINITE`.
fn is_slurm_time(text: &str) -> bool {
    if matches!(text, "UNLIMITED" | "INFINITE" | "unlimited" | "infinite") {
        return true;
    }
    let numbers = |part: &str, most: usize| {
        let fields: Vec<&str> = part.split(':').collect();
        fields.len() <= most
            && fields
                .iter()
                .all(|f| !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()))
    };
    match text.split_once('-') {
        Some((days, rest)) => numbers(days, 1) && numbers(rest, 3),
        None => numbers(text, 3),
    }
}

/// `[R:|B:]SIGNAL[@SECONDS]`, the signal a name (`USR1`, `SIGUSR1`) or a number.
fn is_slurm_signal(text: &str) -> bool {
    let text = text
        .strip_prefix("R:")
        .or_else(|| text.strip_prefix("B:"))
        .unwrap_or(text);
    let (signal, secs) = match text.split_once('@') {
        Some((signal, secs)) => (signal, Some(secs)),
        None => (text, None),
    };
    let name = signal.strip_prefix("SIG").unwrap_or(signal);
    let known = name.parse::<u8>().is_ok_and(|n| (1..=64).contains(&n))
        || format!("SIG{name}")
            .parse::<nix::sys::signal::Signal>()
            .is_ok();
    known && secs.is_none_or(|secs| secs.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::args::Cli;

    /// The `error:` line and exit code of `trainyard ARGS`, refused by a value parser.
    fn refused(args: &[&str]) -> (String, u8) {
        let error = Cli::try_parse_from(std::iter::once("trainyard").chain(args.iter().copied()))
            .expect_err("a refused value");
        let failure =
            refused_value(&error).unwrap_or_else(|| panic!("not a value's refusal: {error}"));
        // As `crate::failed` prints it.
        (format!("error: {}", failure.message()), failure.code)
    }

    #[test]
    fn a_refused_value_reads_as_any_bad_flag_names_the_flag_and_exits_2() {
        for (args, line) in [
            (
                &["run", "--hang-timeout", "soon", "true"][..],
                "error: invalid value `soon` for `--hang-timeout`: hang timeout must be a positive duration such as `90s`, `10m` or `1h30m`, got `soon`",
            ),
            (
                &["run", "--placement-timeout=-1", "true"],
                "error: invalid value `-1` for `--placement-timeout`: expected a positive number of seconds",
            ),
            (
                &["run", "--checkpoint-score", ":min", "true"],
                "error: invalid value `:min` for `--checkpoint-score`: expected a metric's name, optionally followed by :min or :max (loss:min)",
            ),
            (
                &["run", "--ranks", "a-b", "true"],
                "error: invalid value `a-b` for `--ranks`: expected rank numbers or ranges such as 0 or 0,2-3; `a` is not a rank",
            ),
            (
                &["run", "--env", "=value", "true"],
                "error: invalid value `=value` for `--env`: expected KEY=VALUE with a non-empty KEY, or a KEY set in this environment",
            ),
            (
                &["run", "--max-checkpoint-size", "0", "true"],
                "error: invalid value `0` for `--max-checkpoint-size`: expected a positive size such as 20GB or 512MiB",
            ),
            (
                &["run", "--checkpoints-to-keep", "0", "true"],
                "error: invalid value `0` for `--checkpoints-to-keep`: expected a whole number of at least 1",
            ),
            (
                &["plan", "-n", "0"],
                "error: `num_workers` must be between 1 and 1000000, got 0",
            ),
            (
                &["plan", "--resize-interval", "0"],
                "error: resize interval `0` must be a positive duration such as 2s, 1m or 500ms, or a number of seconds",
            ),
            (
                &["cluster", "--time", "1h"],
                "error: invalid value `1h` for `--time`: expected a Slurm time limit: MINUTES, MM:SS, H:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
            ),
        ] {
            assert_eq!(refused(args), (line.to_owned(), 2), "{args:?}");
        }
        let multiline = refused(&["run", "--progress", "a\nb", "true"]).0;
        assert!(
            multiline.starts_with("error: invalid value `a\\nb` for `--progress`"),
            "{multiline}"
        );
    }

    #[test]
    fn ranks_are_checked_against_the_number_of_workers_after_parsing() {
        let within = |text: &str, workers: u32| {
            rank_list(text)
                .expect("rank syntax")
                .within(workers)
                .map_err(|error| ErrorChain(&error).to_string())
        };
        assert_eq!(within("0,2-3", 4), Ok(BTreeSet::from([0, 2, 3])));
        assert_eq!(
            within("9", 2),
            Err("invalid value `9` for `--ranks`: rank 9 does not exist: the run has 2 workers (ranks 0-1)".to_owned())
        );
        assert_eq!(
            within("3-1", 4),
            Err("invalid value `3-1` for `--ranks`: the range 3-1 is empty: write the lower rank first".to_owned())
        );
        assert!(within("3-1", 2).is_err_and(|e| e.contains("rank 3 does not exist")));
    }

    #[test]
    fn slurm_time_limits_are_checked_in_slurms_forms() {
        for good in [
            "30",
            "30:00",
            "1:00:00",
            "2-00",
            "2-12:30",
            "2-12:30:00",
            "UNLIMITED",
        ] {
            assert!(is_slurm_time(good), "{good}");
        }
        for bad in ["", "1h", "1:2:3:4", "-5", "2-", "1.5", "a-1"] {
            assert!(!is_slurm_time(bad), "{bad}");
        }
    }

    #[test]
    fn slurm_signals_are_names_or_numbers_with_a_lead_time() {
        for good in [
            "USR1",
            "USR1@90",
            "SIGUSR1@90",
            "10@60",
            "B:USR1@90",
            "R:TERM",
        ] {
            assert!(is_slurm_signal(good), "{good}");
        }
        for bad in ["", "USR3", "USR1@", "USR1@-1", "USR1@soon", "0", "99"] {
            assert!(!is_slurm_signal(bad), "{bad}");
        }
    }
}
