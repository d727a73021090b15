//! [`NumWorkers`]: a fixed number of workers, or an elastic range of them.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{ConfigError, MAX_WORKERS, checked_num_workers};

/// How often an elastic run looks for room to grow when nothing says sooner: Ray Train's
/// `elastic_resize_monitor_interval_s` (60 s).
pub const DEFAULT_RESIZE_INTERVAL: Duration = Duration::from_secs(60);

/// How many workers a run has: a fixed number, or an elastic range `min..=max` (Ray Train's
/// `num_workers=(min, max)`, torchrun's `--nnodes MIN:MAX`). An elastic run starts once
/// `min` workers fit, with as many as fit up to `max`, and grows when room appears.
///
/// Written `4`, `"2:8"` or `[2, 8]` in TOML and JSON, `4` or `2:8` on the command line. A
/// range whose ends are equal is the fixed number.
///
/// ```
/// use trainyard_config::NumWorkers;
///
/// let elastic: NumWorkers = "2:8".parse()?;
/// assert_eq!((elastic.min(), elastic.max(), elastic.is_elastic()), (2, 8, true));
/// assert_eq!(elastic.to_string(), "2:8");
/// assert_eq!(NumWorkers::from(4), "4:4".parse::<NumWorkers>()?);
/// assert!("8:2".parse::<NumWorkers>().is_err());
/// # Ok::<(), trainyard_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NumWorkers {
    min: u32,
    max: u32,
}

impl NumWorkers {
    /// Exactly `n` workers (not checked: see [`NumWorkers::validate`]).
    #[must_use]
    pub const fn fixed(n: u32) -> Self {
        Self { min: n, max: n }
    }

    /// Between `min` and `max` workers.
    ///
    /// # Errors
    /// [`ConfigError::NumWorkersOutOfRange`] when an end is outside `1..=MAX_WORKERS`,
    /// [`ConfigError::NumWorkersRange`] when `min > max`.
    pub fn range(min: i64, max: i64) -> Result<Self, ConfigError> {
        let checked = Self {
            min: checked_num_workers(min)?,
            max: checked_num_workers(max)?,
        };
        checked.validate()?;
        Ok(checked)
    }

    /// The fewest workers the run starts with.
    #[must_use]
    pub const fn min(self) -> u32 {
        self.min
    }

    /// The most workers the run grows to (the fixed number when not elastic).
    #[must_use]
    pub const fn max(self) -> u32 {
        self.max
    }

    /// Whether the number can change between attempts.
    #[must_use]
    pub const fn is_elastic(self) -> bool {
        self.min != self.max
    }

    /// `n` clamped into the range.
    #[must_use]
    pub fn clamp(self, n: u32) -> u32 {
        n.clamp(self.min, self.max)
    }

    /// Checks both ends and their order.
    ///
    /// # Errors
    /// As [`NumWorkers::range`].
    pub fn validate(self) -> Result<(), ConfigError> {
        checked_num_workers(i64::from(self.min))?;
        checked_num_workers(i64::from(self.max))?;
        if self.min > self.max {
            return Err(ConfigError::NumWorkersRange {
                min: self.min,
                max: self.max,
            });
        }
        Ok(())
    }
}

impl Default for NumWorkers {
    fn default() -> Self {
        Self::fixed(1)
    }
}

impl From<u32> for NumWorkers {
    fn from(n: u32) -> Self {
        Self::fixed(n)
    }
}

impl From<RangeInclusive<u32>> for NumWorkers {
    fn from(range: RangeInclusive<u32>) -> Self {
        Self {
            min: *range.start(),
            max: *range.end(),
        }
    }
}

impl PartialEq<u32> for NumWorkers {
    fn eq(&self, n: &u32) -> bool {
        !self.is_elastic() && self.max == *n
    }
}

impl fmt::Display for NumWorkers {
    /// `4`, or `2:8` for a range.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_elastic() {
            write!(f, "{}:{}", self.min, self.max)
        } else {
            write!(f, "{}", self.max)
        }
    }
}

impl FromStr for NumWorkers {
    type Err = ConfigError;

    /// `N` or `MIN:MAX`, each from 1 to [`MAX_WORKERS`].
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let number = |part: &str| {
            part.trim()
                .parse::<i64>()
                .map_err(|_| ConfigError::NumWorkersText(text.to_owned()))
        };
        match text.split_once(':') {
            Some((min, max)) => Self::range(number(min)?, number(max)?),
            None => checked_num_workers(number(text)?).map(Self::fixed),
        }
    }
}

impl Serialize for NumWorkers {
    /// A number when fixed, `[min, max]` when elastic.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_elastic() {
            [self.min, self.max].serialize(s)
        } else {
            s.serialize_u32(self.max)
        }
    }
}

impl<'de> Deserialize<'de> for NumWorkers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Number(i64),
            Text(String),
            Pair(Vec<i64>),
        }
        let given = Given::deserialize(d).map_err(|_| {
            serde::de::Error::custom(format!(
                "`num_workers` must be a number of workers from 1 to {MAX_WORKERS}, or a range written \"MIN:MAX\" or [MIN, MAX]"
            ))
        })?;
        match given {
            Given::Number(n) => checked_num_workers(n).map(Self::fixed),
            Given::Text(text) => text.parse(),
            Given::Pair(pair) => match pair[..] {
                [min, max] => Self::range(min, max),
                _ => Err(ConfigError::NumWorkersText(format!("{pair:?}"))),
            },
        }
        .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_ranges_are_read_from_text_and_written_back() {
        for (text, min, max, shown) in [
            ("4", 4, 4, "4"),
            ("2:8", 2, 8, "2:8"),
            (" 1 : 4 ", 1, 4, "1:4"),
            ("3:3", 3, 3, "3"),
        ] {
            let n: NumWorkers = text.parse().unwrap();
            assert_eq!(
                (n.min(), n.max(), n.to_string().as_str()),
                (min, max, shown)
            );
        }
    }

    #[test]
    fn bad_ranges_say_what_would_be_accepted() {
        let message = |text: &str| text.parse::<NumWorkers>().unwrap_err().to_string();
        assert_eq!(
            message("0:4"),
            "`num_workers` must be between 1 and 1000000, got 0"
        );
        assert_eq!(
            message("8:2"),
            "`num_workers` range 8:2 has its minimum above its maximum: write MIN:MAX with MIN <= MAX"
        );
        assert_eq!(
            message("two"),
            "`num_workers` must be a number of workers or a range MIN:MAX (such as 4 or 2:8), got `two`"
        );
        assert_eq!(
            message("2:"),
            "`num_workers` must be a number of workers or a range MIN:MAX (such as 4 or 2:8), got `2:`"
        );
    }

    #[test]
    fn json_takes_a_number_a_string_or_a_pair() {
        for (json, expected) in [
            ("4", NumWorkers::fixed(4)),
            ("\"2:8\"", NumWorkers::from(2..=8)),
            ("[2, 8]", NumWorkers::from(2..=8)),
        ] {
            let n: NumWorkers = serde_json::from_str(json).unwrap();
            assert_eq!(n, expected, "{json}");
        }
        assert_eq!(
            serde_json::to_string(&NumWorkers::from(2..=8)).unwrap(),
            "[2,8]"
        );
        assert_eq!(serde_json::to_string(&NumWorkers::fixed(3)).unwrap(), "3");
        let error = serde_json::from_str::<NumWorkers>("[1, 2, 3]").unwrap_err();
        assert!(error.to_string().contains("[1, 2, 3]"), "{error}");
        let error = serde_json::from_str::<NumWorkers>("[0, 2]").unwrap_err();
        assert!(error.to_string().contains("got 0"), "{error}");
    }
}
