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

/// What a run is called, how it survives failures, and the environment its workers get.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Name of the run (shown in logs); a generated one when `None`.
    pub name: Option<String>,
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

    /// Checks the environment variable names.
    ///
    /// # Errors
    /// [`ConfigError::EnvName`] for a name that cannot be set.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
