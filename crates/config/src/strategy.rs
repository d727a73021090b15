//! [`PlacementStrategy`]: how the bundles of a placement group are laid over nodes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a placement group's bundles are laid over nodes, in Ray's spelling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlacementStrategy {
    /// As few nodes as possible, best effort.
    #[default]
    Pack,
    /// As many nodes as possible, best effort.
    Spread,
    /// All bundles on one node, or fail.
    StrictPack,
    /// Every bundle on a different node, or fail.
    StrictSpread,
}

impl PlacementStrategy {
    /// Every strategy, in Ray's order.
    pub const ALL: [Self; 4] = [
        Self::Pack,
        Self::Spread,
        Self::StrictPack,
        Self::StrictSpread,
    ];

    /// Ray's spelling: `PACK`, `SPREAD`, `STRICT_PACK`, `STRICT_SPREAD`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pack => "PACK",
            Self::Spread => "SPREAD",
            Self::StrictPack => "STRICT_PACK",
            Self::StrictSpread => "STRICT_SPREAD",
        }
    }

    /// Whether the strategy fails rather than bending its rule.
    #[must_use]
    pub const fn is_strict(self) -> bool {
        matches!(self, Self::StrictPack | Self::StrictSpread)
    }
}

/// A text that names no placement strategy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid placement strategy `{0}`: expected one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"
)]
pub struct UnknownStrategy(pub String);

impl fmt::Display for PlacementStrategy {
    /// Ray's spelling, as [`PlacementStrategy::as_str`]; [`FromStr`] parses it back.
    ///
    /// ```
    /// use trainyard_config::PlacementStrategy;
    ///
    /// assert_eq!(PlacementStrategy::Spread.to_string(), "SPREAD");
    /// assert_eq!(PlacementStrategy::StrictPack.to_string(), "STRICT_PACK");
    /// for strategy in PlacementStrategy::ALL {
    ///     assert_eq!(strategy.to_string().parse::<PlacementStrategy>()?, strategy);
    /// }
    /// # Ok::<(), trainyard_config::UnknownStrategy>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PlacementStrategy {
    type Err = UnknownStrategy;

    /// Ray's spelling, in any case (`spread` and `SPREAD` alike).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| UnknownStrategy(text.to_owned()))
    }
}

impl Serialize for PlacementStrategy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for PlacementStrategy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rays_spelling_round_trips_through_serde_and_text() {
        for s in PlacementStrategy::ALL {
            assert_eq!(s.as_str().parse::<PlacementStrategy>().unwrap(), s);
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<PlacementStrategy>(&json).unwrap(), s);
        }
        assert_eq!(
            serde_json::to_string(&PlacementStrategy::StrictSpread).unwrap(),
            "\"STRICT_SPREAD\""
        );
        assert_eq!(
            "strict_pack".parse::<PlacementStrategy>().unwrap(),
            PlacementStrategy::StrictPack
        );
        let err = "RANDOM".parse::<PlacementStrategy>().unwrap_err();
        assert!(err.to_string().contains("`RANDOM`") && err.to_string().contains("STRICT_SPREAD"));
    }
}
