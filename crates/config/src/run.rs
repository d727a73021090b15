//! [`FailureConfig`] and [`RunConfig`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ConfigError;

/// How many times a failed run is restarted, as Ray Train v2's `max_failures`.
///
/// `max_failures: Some(n)` allows `n` restarts (the run fails on failure `n + 1`);
/// `None` (written `-1` or `null`) restarts without limit. The default is `Some(0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailureConfig {
    /// Restarts allowed; `None` is unlimited.
    #[serde(
        serialize_with = "serialize_max_failures",
        deserialize_with = "deserialize_max_failures"
    )]
    pub max_failures: Option<u32>,
}

impl Default for FailureConfig {
    fn default() -> Self {
        Self {
            max_failures: Some(0),
        }
    }
}

impl FailureConfig {
    /// Allows `n` restarts.
    #[must_use]
    pub const fn restarts(n: u32) -> Self {
        Self {
            max_failures: Some(n),
        }
    }

    /// Restarts without limit.
    #[must_use]
    pub const fn unlimited() -> Self {
        Self { max_failures: None }
    }

    /// From Ray's integer convention: `-1` is unlimited, `n ≥ 0` is `n` restarts.
    ///
    /// # Errors
    /// [`ConfigError::MaxFailures`] below -1.
    pub fn from_max_failures(value: i64) -> Result<Self, ConfigError> {
        match value {
            -1 => Ok(Self::unlimited()),
            n => u32::try_from(n)
                .map(Self::restarts)
                .map_err(|_| ConfigError::MaxFailures(n)),
        }
    }

    /// Whether the run is restarted after its `failures`-th failure (counting from 1).
    #[must_use]
    pub fn should_restart(&self, failures: u32) -> bool {
        self.max_failures.is_none_or(|max| failures <= max)
    }
}

fn serialize_max_failures<S: Serializer>(value: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(n) => s.serialize_i64(i64::from(*n)),
        None => s.serialize_i64(-1),
    }
}

fn deserialize_max_failures<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<i64>::deserialize(d)? {
        None => Ok(None),
        Some(n) => FailureConfig::from_max_failures(n)
            .map(|c| c.max_failures)
            .map_err(serde::de::Error::custom),
    }
}

/// Which way a checkpoint's score is better, as Ray's `checkpoint_score_order`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreOrder {
    /// Higher is better (Ray's default).
    #[default]
    Max,
    /// Lower is better (a loss).
    Min,
}

impl std::str::FromStr for ScoreOrder {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "max" => Ok(Self::Max),
            "min" => Ok(Self::Min),
            other => Err(ConfigError::ScoreOrder(other.to_owned())),
        }
    }
}

impl std::fmt::Display for ScoreOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Max => "max",
            Self::Min => "min",
        })
    }
}

/// Which committed checkpoints a run keeps, as Ray Train's `CheckpointConfig`. The latest
/// committed checkpoint is never deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// How many to keep (the best by the score, else the newest); `None` keeps all.
    pub num_to_keep: Option<u32>,
    /// The reported metric that ranks checkpoints; `None` ranks them by age.
    pub checkpoint_score_attribute: Option<String>,
    /// Which way the score is better.
    pub checkpoint_score_order: ScoreOrder,
    /// The most files one rank may hand in for one checkpoint; `None`: no bound.
    pub max_checkpoint_files: Option<u64>,
    /// The most bytes one rank may hand in for one checkpoint (`"10GB"`); `None`: no bound.
    pub max_checkpoint_size: Option<trainyard_resources::ByteSize>,
}

impl CheckpointConfig {
    /// Sets `num_to_keep`.
    #[must_use]
    pub const fn num_to_keep(mut self, n: u32) -> Self {
        self.num_to_keep = Some(n);
        self
    }

    /// Sets the score attribute and its order.
    #[must_use]
    pub fn score(mut self, attribute: impl Into<String>, order: ScoreOrder) -> Self {
        self.checkpoint_score_attribute = Some(attribute.into());
        self.checkpoint_score_order = order;
        self
    }

    /// Bounds what one rank may hand in for one checkpoint: at most `files` files of at most
    /// `bytes` bytes in all (`None`: no bound); a hand-in beyond either fails, naming it.
    #[must_use]
    pub const fn max_checkpoint(
        mut self,
        files: Option<u64>,
        bytes: Option<trainyard_resources::ByteSize>,
    ) -> Self {
        self.max_checkpoint_files = files;
        self.max_checkpoint_size = bytes;
        self
    }

    /// Checks `num_to_keep` (at least 1, as Ray requires) and the attribute's name.
    ///
    /// # Errors
    /// [`ConfigError::NumToKeep`], [`ConfigError::ScoreAttribute`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.num_to_keep == Some(0) {
            return Err(ConfigError::NumToKeep(0));
        }
        match &self.checkpoint_score_attribute {
            Some(attribute) if attribute.trim().is_empty() => {
                Err(ConfigError::ScoreAttribute(attribute.clone()))
            }
            _ => Ok(()),
        }
    }
}

/// Checks that `name` can be a run's folder name: 1 to 200 letters, digits, `-`, `_` and `.`,
/// not `.` or `..` (so no name reaches outside its storage).
///
/// # Errors
/// [`ConfigError::RunName`].
pub fn check_run_name(name: &str) -> Result<(), ConfigError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 200
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if bad {
        Err(ConfigError::RunName(name.to_owned()))
    } else {
        Ok(())
    }
}

/// What a run does when its folder already holds a run of the same name.
///
/// A resumed run goes on from its latest committed checkpoint: its attempts are added to
/// the record's, and its checkpoints go on from the highest index the run reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumePolicy {
    /// Resume an unfinished run; refuse a finished one (the CLI's default: running a
    /// command again does not train a finished model further unasked).
    #[default]
    Auto,
    /// Resume the run whatever its status, a finished one included, which runs again and
    /// trains on from its latest checkpoint (Ray Train v2's behaviour: "train 10 more
    /// epochs" by running the same program again).
    Always,
    /// Never resume: start afresh in a new folder (the name with `-2`, `-3`, ... appended).
    Never,
}

impl ResumePolicy {
    /// Whether a run that has finished is resumed (else refused, or, with
    /// [`ResumePolicy::Never`], left alone for a fresh folder).
    #[must_use]
    pub const fn resumes_finished(self) -> bool {
        matches!(self, Self::Always)
    }
}

impl std::str::FromStr for ResumePolicy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(ConfigError::Resume(other.to_owned())),
        }
    }
}

impl std::fmt::Display for ResumePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        })
    }
}

/// What counts as a rank's progress for [`RunConfig::hang_timeout`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressSource {
    /// A report (with or without a checkpoint).
    #[default]
    Reports,
    /// A report, or a line of output: for programs that do not report.
    Output,
}

impl std::str::FromStr for ProgressSource {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reports" => Ok(Self::Reports),
            "output" => Ok(Self::Output),
            other => Err(ConfigError::Progress(other.to_owned())),
        }
    }
}

impl std::fmt::Display for ProgressSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Reports => "reports",
            Self::Output => "output",
        })
    }
}

/// Parses a hang timeout: a duration with units (`90s`, `10m`, `1h30m`, `500ms`) or a
/// number of seconds; it must be positive.
///
/// ```
/// use std::time::Duration;
/// use trainyard_config::parse_hang_timeout;
///
/// assert_eq!(parse_hang_timeout("10m").unwrap(), Duration::from_secs(600));
/// assert_eq!(parse_hang_timeout("90").unwrap(), Duration::from_secs(90));
/// assert!(parse_hang_timeout("-1").is_err());
/// assert!(parse_hang_timeout("0s").is_err());
/// ```
///
/// # Errors
/// [`ConfigError::HangTimeout`] for anything else.
pub fn parse_hang_timeout(text: &str) -> Result<Duration, ConfigError> {
    positive_duration(text).ok_or_else(|| ConfigError::HangTimeout(text.to_owned()))
}

/// Parses an elastic run's resize interval, written as a [hang
/// timeout](parse_hang_timeout) is: `2s`, `1m`, `500ms`, or a number of seconds.
///
/// ```
/// use std::time::Duration;
/// use trainyard_config::parse_resize_interval;
///
/// assert_eq!(parse_resize_interval("2s").unwrap(), Duration::from_secs(2));
/// assert!(parse_resize_interval("0").is_err());
/// ```
///
/// # Errors
/// [`ConfigError::ResizeInterval`] for anything but a positive duration.
pub fn parse_resize_interval(text: &str) -> Result<Duration, ConfigError> {
    positive_duration(text).ok_or_else(|| ConfigError::ResizeInterval(text.to_owned()))
}

/// A positive duration with units (`90s`, `10m`, `1h30m`, `500ms`) or in seconds.
fn positive_duration(text: &str) -> Option<Duration> {
    let trimmed = text.trim();
    let parsed = match trimmed.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs < 1e12 => {
            Some(Duration::from_secs_f64(secs))
        }
        Ok(_) => None,
        Err(_) => humantime::parse_duration(trimmed).ok(),
    };
    parsed.filter(|d| !d.is_zero())
}

/// A duration as humantime writes it (`1m 30s`), for optional durations in configs.
pub(crate) fn serialize_duration<S: Serializer>(
    value: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        None => s.serialize_none(),
    }
}

/// An optional duration written as text or as a number of seconds, checked by `parse`.
pub(crate) fn deserialize_duration<'de, D: Deserializer<'de>>(
    d: D,
    parse: fn(&str) -> Result<Duration, ConfigError>,
) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Secs(f64),
        Text(String),
    }
    let text = match Option::<Given>::deserialize(d)? {
        None => return Ok(None),
        Some(Given::Secs(secs)) => secs.to_string(),
        Some(Given::Text(text)) => text,
    };
    parse(&text).map(Some).map_err(serde::de::Error::custom)
}

fn deserialize_hang_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    deserialize_duration(d, parse_hang_timeout)
}

/// What a run is called, where it keeps its folder, how it survives failures, and the
/// environment its workers get.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Name of the run (its folder's name); a generated one when `None`.
    pub name: Option<String>,
    /// Where run folders live: a path, `file:///PATH` or `s3://BUCKET[/PREFIX]`;
    /// `~/trainyard_results` when `None`.
    pub storage_path: Option<String>,
    /// Which committed checkpoints are kept.
    pub checkpoint_config: CheckpointConfig,
    /// What happens when the folder holds a run of the same name.
    pub resume: ResumePolicy,
    /// Restart policy.
    pub failure_config: FailureConfig,
    /// Environment variables every worker's task gets.
    pub env: BTreeMap<String, String>,
    /// How long a rank may go without progress (see [`RunConfig::progress`]) before the
    /// attempt counts as hung: its ranks' stacks are captured, and it fails (and restarts
    /// under `failure_config`). Counted from the task's start, then from the rank's last
    /// progress. `None` (the default) never judges a run hung.
    #[serde(
        serialize_with = "serialize_duration",
        deserialize_with = "deserialize_hang_timeout"
    )]
    pub hang_timeout: Option<Duration>,
    /// What counts as progress.
    pub progress: ProgressSource,
    /// Where each rank's output is written, one file a rank and attempt
    /// (`<log_dir>/attempt_<k>/rank_<r>.log`); the run folder's `logs/` when `None`.
    pub log_dir: Option<String>,
    /// A folder to write TensorBoard event files of rank 0's numeric metrics to
    /// (`tensorboard --logdir` reads them), one file a driver; none when `None`.
    pub tensorboard_dir: Option<String>,
    /// An MLflow tracking server (`http://host:5000`) to keep the run in: one MLflow run for
    /// the run, over restarts and resumes, with its configuration as parameters, rank 0's
    /// metrics at their steps and its checkpoints as tags; none when `None`.
    pub mlflow: Option<String>,
}

impl RunConfig {
    /// Sets `name`.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets `storage_path`.
    #[must_use]
    pub fn storage_path(mut self, storage: impl Into<String>) -> Self {
        self.storage_path = Some(storage.into());
        self
    }

    /// Sets `checkpoint_config`.
    #[must_use]
    pub fn checkpoint_config(mut self, checkpoint_config: CheckpointConfig) -> Self {
        self.checkpoint_config = checkpoint_config;
        self
    }

    /// Sets `resume`.
    #[must_use]
    pub const fn resume(mut self, resume: ResumePolicy) -> Self {
        self.resume = resume;
        self
    }

    /// Sets `failure_config`.
    #[must_use]
    pub fn failure_config(mut self, failure_config: FailureConfig) -> Self {
        self.failure_config = failure_config;
        self
    }

    /// Sets `hang_timeout`.
    #[must_use]
    pub const fn hang_timeout(mut self, timeout: Duration) -> Self {
        self.hang_timeout = Some(timeout);
        self
    }

    /// Sets `progress`.
    #[must_use]
    pub const fn progress(mut self, progress: ProgressSource) -> Self {
        self.progress = progress;
        self
    }

    /// Sets `tensorboard_dir`.
    #[must_use]
    pub fn tensorboard_dir(mut self, dir: impl Into<String>) -> Self {
        self.tensorboard_dir = Some(dir.into());
        self
    }

    /// Sets `mlflow`.
    #[must_use]
    pub fn mlflow(mut self, tracking_uri: impl Into<String>) -> Self {
        self.mlflow = Some(tracking_uri.into());
        self
    }

    /// Sets `log_dir`.
    #[must_use]
    pub fn log_dir(mut self, dir: impl Into<String>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// Adds one environment variable.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Checks the name, the checkpoint config and the environment variable names.
    ///
    /// # Errors
    /// [`ConfigError::RunName`] for a name that cannot be a folder's,
    /// [`ConfigError::EnvName`] for a variable name that cannot be set, and the errors of
    /// [`CheckpointConfig::validate`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(name) = &self.name {
            check_run_name(name)?;
        }
        self.checkpoint_config.validate()?;
        if self.hang_timeout.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::HangTimeout("0s".to_owned()));
        }
        match self
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            Some(bad) => Err(ConfigError::EnvName(bad.clone())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_failures_counts_restarts_as_ray_train_v2() {
        for n in [0u32, 1, 10] {
            let config = FailureConfig::restarts(n);
            for failure in 1..=n {
                assert!(config.should_restart(failure), "n={n} failure={failure}");
            }
            assert!(!config.should_restart(n + 1), "n={n}");
        }
        assert!(FailureConfig::unlimited().should_restart(u32::MAX));
        assert!(!FailureConfig::default().should_restart(1));
    }

    #[test]
    fn minus_one_and_null_mean_unlimited() {
        let c: FailureConfig = serde_json::from_str(r#"{"max_failures": -1}"#).unwrap();
        assert_eq!(c, FailureConfig::unlimited());
        let c: FailureConfig = serde_json::from_str(r#"{"max_failures": null}"#).unwrap();
        assert_eq!(c, FailureConfig::unlimited());
        assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"max_failures":-1}"#);
        let err = serde_json::from_str::<FailureConfig>(r#"{"max_failures": -2}"#).unwrap_err();
        assert!(err.to_string().contains("got -2"), "{err}");
        assert_eq!(
            FailureConfig::from_max_failures(3).unwrap(),
            FailureConfig::restarts(3)
        );
    }

    #[test]
    fn hang_timeouts_read_units_and_plain_seconds() {
        for (text, secs) in [
            ("90s", 90.0),
            ("10m", 600.0),
            ("1h30m", 5400.0),
            ("2.5", 2.5),
            ("500ms", 0.5),
        ] {
            assert_eq!(
                parse_hang_timeout(text).unwrap().as_secs_f64(),
                secs,
                "{text}"
            );
        }
        for bad in ["-1", "0", "0s", "soon", "", "NaN", "inf"] {
            let err = parse_hang_timeout(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
        let run: RunConfig =
            serde_json::from_str(r#"{"hang_timeout": "90s", "progress": "output"}"#).unwrap();
        assert_eq!(run.hang_timeout, Some(Duration::from_secs(90)));
        assert_eq!(run.progress, ProgressSource::Output);
        let back: RunConfig = serde_json::from_str(&serde_json::to_string(&run).unwrap()).unwrap();
        assert_eq!(back, run);
        let run: RunConfig = toml::from_str("hang_timeout = 30").unwrap();
        assert_eq!(run.hang_timeout, Some(Duration::from_secs(30)));
        assert!(serde_json::from_str::<RunConfig>(r#"{"hang_timeout": "-1"}"#).is_err());
    }

    #[test]
    fn resume_policies_read_and_write_their_names() {
        for policy in [
            ResumePolicy::Auto,
            ResumePolicy::Always,
            ResumePolicy::Never,
        ] {
            assert_eq!(policy.to_string().parse::<ResumePolicy>().unwrap(), policy);
            let json = serde_json::to_string(&policy).unwrap();
            assert_eq!(json, format!("\"{policy}\""));
        }
        assert!(ResumePolicy::Always.resumes_finished());
        assert!(!ResumePolicy::Auto.resumes_finished());
        let err = "sometimes".parse::<ResumePolicy>().unwrap_err().to_string();
        assert_eq!(
            err,
            "resume must be `auto`, `always` or `never`, got `sometimes`"
        );
    }

    #[test]
    fn env_names_are_checked() {
        assert!(RunConfig::default().env("A", "1").validate().is_ok());
        assert!(matches!(
            RunConfig::default().env("A=B", "1").validate(),
            Err(ConfigError::EnvName(_))
        ));
        assert!(matches!(
            RunConfig::default().env("", "1").validate(),
            Err(ConfigError::EnvName(_))
        ));
    }
}
