//! [`FailureConfig`] and [`RunConfig`].

use std::collections::BTreeMap;

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

/// What a run does when its folder already holds a run of the same name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumePolicy {
    /// Resume an unfinished run from its latest checkpoint; refuse a finished one.
    #[default]
    Auto,
    /// Never resume: start afresh in a new folder (the name with `-2`, `-3`, ... appended).
    Never,
}

impl std::str::FromStr for ResumePolicy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "never" => Ok(Self::Never),
            other => Err(ConfigError::Resume(other.to_owned())),
        }
    }
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
            let bad = name.is_empty()
                || name == "."
                || name == ".."
                || name.len() > 200
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if bad {
                return Err(ConfigError::RunName(name.clone()));
            }
        }
        self.checkpoint_config.validate()?;
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
