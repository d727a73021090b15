//! [`ResourceAmount`]: an exact, non-negative quantity with a precision of 0.0001.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::decimal::{Decimal, DecimalError};

/// Number of steps in one whole unit: amounts are exact multiples of 0.0001.
pub const STEPS_PER_UNIT: u128 = 10_000;

/// An exact, non-negative resource quantity (CPUs, GPUs, bytes, custom units).
///
/// Stored as a whole number of 0.0001 steps, so `0.1 + 0.2` GPUs is exactly `0.3` and sums
/// over many workers never drift. Finer precision is an error, not a rounding, as in Ray.
///
/// ```
/// use trainyard_resources::ResourceAmount;
///
/// let a: ResourceAmount = "0.1".parse()?;
/// let b = ResourceAmount::try_from(0.2)?;
/// assert_eq!(a.checked_add(b), Some("0.3".parse()?));
/// assert_eq!(a.to_string(), "0.1");
/// assert!("0.00015".parse::<ResourceAmount>().is_err());
/// # Ok::<(), trainyard_resources::AmountError>(())
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceAmount(u128);

/// Why a value is not a [`ResourceAmount`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AmountError {
    /// NaN or an infinity.
    #[error("amount must be a finite number, got {0}")]
    NotFinite(f64),
    /// Below zero.
    #[error("amount must not be negative, got {0}")]
    Negative(String),
    /// Has digits beyond the fourth decimal place.
    #[error("the precision of a fractional amount cannot go beyond 0.0001, got {0}")]
    TooPrecise(String),
    /// Not a decimal number at all.
    #[error("amount must be a non-negative number such as 1, 0.5 or 2e3, got `{0}`")]
    NotANumber(String),
    /// Larger than [`ResourceAmount::MAX`], the most Ray can represent.
    #[error(
        "amount is too large, got {0}: at most 922337203685477.5807 (Ray keeps amounts as 64-bit numbers of 0.0001 steps)"
    )]
    TooLarge(String),
}

impl ResourceAmount {
    /// Nothing.
    pub const ZERO: Self = Self(0);
    /// One whole unit.
    pub const ONE: Self = Self(STEPS_PER_UNIT);
    /// The smallest positive amount, 0.0001.
    pub const STEP: Self = Self(1);
    /// The largest amount parsing accepts, 922337203685477.5807: Ray keeps every resource
    /// quantity as a signed 64-bit number of 0.0001 steps, so nothing larger can be asked of
    /// it, and such an amount always prints (as text and as a JSON number). Sums of amounts
    /// may go beyond it.
    ///
    /// ```
    /// use trainyard_resources::{AmountError, ResourceAmount};
    ///
    /// assert_eq!(ResourceAmount::MAX.to_string(), "922337203685477.5807");
    /// assert_eq!("922337203685477.5807".parse(), Ok(ResourceAmount::MAX));
    /// assert!(matches!("1e30".parse::<ResourceAmount>(), Err(AmountError::TooLarge(_))));
    /// ```
    pub const MAX: Self = Self(i64::MAX as u128);

    /// `units` whole units.
    #[must_use]
    pub const fn from_units(units: u64) -> Self {
        Self(units as u128 * STEPS_PER_UNIT)
    }

    /// An amount of `steps` × 0.0001.
    #[must_use]
    pub const fn from_steps(steps: u128) -> Self {
        Self(steps)
    }

    /// The amount as a whole number of 0.0001 steps.
    #[must_use]
    pub const fn steps(self) -> u128 {
        self.0
    }

    /// Whether the amount is zero.
    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whether the amount is a whole number of units.
    #[must_use]
    pub const fn is_whole(self) -> bool {
        self.0 % STEPS_PER_UNIT == 0
    }

    /// The whole part, rounded toward zero.
    #[must_use]
    pub const fn whole_units(self) -> u128 {
        self.0 / STEPS_PER_UNIT
    }

    /// The amount as `u64` whole units, when it is whole and fits.
    #[must_use]
    pub fn as_whole_u64(self) -> Option<u64> {
        if self.is_whole() {
            u64::try_from(self.whole_units()).ok()
        } else {
            None
        }
    }

    /// The `f64` nearest to the amount, correctly rounded once, so that
    /// `ResourceAmount::try_from(a.as_f64())` gives `a` back for amounts of up to 15
    /// significant digits.
    #[must_use]
    pub fn as_f64(self) -> f64 {
        // The decimal text is parsed with a single correct rounding; computing
        // `whole + frac` in floating point would round twice.
        self.to_string()
            .parse()
            .unwrap_or(self.0 as f64 / STEPS_PER_UNIT as f64)
    }

    /// `self + other`, or `None` on overflow.
    #[must_use]
    pub const fn checked_add(self, other: Self) -> Option<Self> {
        match self.0.checked_add(other.0) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// `self - other`, or `None` when `other` is larger.
    #[must_use]
    pub const fn checked_sub(self, other: Self) -> Option<Self> {
        match self.0.checked_sub(other.0) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// `self × times`, or `None` on overflow.
    #[must_use]
    pub const fn checked_mul(self, times: u64) -> Option<Self> {
        match self.0.checked_mul(times as u128) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// `self - other`, or zero when `other` is larger.
    #[must_use]
    pub const fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// How many whole times `part` fits into `self` (`None` when `part` is zero).
    #[must_use]
    pub const fn times_fits(self, part: Self) -> Option<u128> {
        self.0.checked_div(part.0)
    }
}

impl fmt::Debug for ResourceAmount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ResourceAmount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.whole_units();
        let frac = self.0 % STEPS_PER_UNIT;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:04}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

impl FromStr for ResourceAmount {
    type Err = AmountError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let decimal = Decimal::parse(trimmed).map_err(|e| match e {
            DecimalError::Syntax => AmountError::NotANumber(text.to_owned()),
            DecimalError::Negative => AmountError::Negative(trimmed.to_owned()),
            DecimalError::TooLarge => AmountError::TooLarge(trimmed.to_owned()),
        })?;
        match decimal.scaled_exact(STEPS_PER_UNIT) {
            Ok(Some(steps)) if steps <= Self::MAX.0 => Ok(Self(steps)),
            Ok(Some(_)) => Err(AmountError::TooLarge(trimmed.to_owned())),
            Ok(None) => Err(AmountError::TooPrecise(trimmed.to_owned())),
            Err(_) => Err(AmountError::TooLarge(trimmed.to_owned())),
        }
    }
}

impl TryFrom<f64> for ResourceAmount {
    type Error = AmountError;

    /// Converts through the shortest decimal text that round-trips the `f64`, so `0.1`
    /// becomes exactly 0.1 and `0.00015` is rejected rather than rounded.
    fn try_from(value: f64) -> Result<Self, Self::Error> {
        if !value.is_finite() {
            return Err(AmountError::NotFinite(value));
        }
        if value < 0.0 {
            return Err(AmountError::Negative(value.to_string()));
        }
        // `-0.0` displays as "-0", which parses as zero.
        value.to_string().parse()
    }
}

impl From<u32> for ResourceAmount {
    fn from(units: u32) -> Self {
        Self::from_units(u64::from(units))
    }
}

impl From<u64> for ResourceAmount {
    fn from(units: u64) -> Self {
        Self::from_units(units)
    }
}

impl std::iter::Sum for ResourceAmount {
    /// Sums the amounts; saturates at the largest representable amount.
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        Self(iter.fold(0u128, |acc, a| acc.saturating_add(a.0)))
    }
}

impl Serialize for ResourceAmount {
    /// A JSON number: an integer when whole (`10000`), a float otherwise (`0.5`).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_whole() {
            let whole = self.whole_units();
            match u64::try_from(whole) {
                Ok(small) => serializer.serialize_u64(small),
                Err(_) => serializer.serialize_u128(whole),
            }
        } else {
            serializer.serialize_f64(self.as_f64())
        }
    }
}

impl<'de> Deserialize<'de> for ResourceAmount {
    /// Accepts a number or a string holding one.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AmountVisitor)
    }
}

struct AmountVisitor;

impl Visitor<'_> for AmountVisitor {
    type Value = ResourceAmount;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative number with at most 4 decimal places")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.visit_u128(u128::from(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Self::Value, E> {
        v.checked_mul(STEPS_PER_UNIT)
            .filter(|steps| *steps <= ResourceAmount::MAX.0)
            .map(ResourceAmount)
            .ok_or_else(|| E::custom(AmountError::TooLarge(v.to_string())))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::custom(AmountError::Negative(v.to_string()))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        ResourceAmount::try_from(v).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        v.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(text: &str) -> ResourceAmount {
        text.parse().unwrap()
    }

    #[test]
    fn tenths_add_up_exactly() {
        let sum = ResourceAmount::try_from(0.1)
            .unwrap()
            .checked_add(ResourceAmount::try_from(0.2).unwrap())
            .unwrap();
        assert_eq!(sum, amount("0.3"));
        assert_eq!(sum.to_string(), "0.3");
    }

    #[test]
    fn display_round_trips_the_user_syntax() {
        for text in ["0", "1", "0.5", "0.0001", "12.25", "1000000000", "3.1416"] {
            assert_eq!(amount(text).to_string(), text);
        }
        assert_eq!(amount("2e3").to_string(), "2000");
        assert_eq!(amount("1.50").to_string(), "1.5");
    }

    #[test]
    fn finer_precision_than_a_ten_thousandth_is_an_error_not_a_rounding() {
        assert_eq!(
            "0.00015".parse::<ResourceAmount>(),
            Err(AmountError::TooPrecise("0.00015".into()))
        );
        assert!(matches!(
            ResourceAmount::try_from(1e-7),
            Err(AmountError::TooPrecise(_))
        ));
        assert_eq!(
            ResourceAmount::try_from(0.0001).unwrap(),
            ResourceAmount::STEP
        );
    }

    #[test]
    fn nan_infinities_and_negatives_are_rejected() {
        assert!(matches!(
            ResourceAmount::try_from(f64::NAN),
            Err(AmountError::NotFinite(_))
        ));
        assert!(matches!(
            ResourceAmount::try_from(f64::INFINITY),
            Err(AmountError::NotFinite(_))
        ));
        assert!(matches!(
            ResourceAmount::try_from(-1.0),
            Err(AmountError::Negative(_))
        ));
        assert_eq!(
            "-1".parse::<ResourceAmount>(),
            Err(AmountError::Negative("-1".into()))
        );
        assert_eq!(
            ResourceAmount::try_from(-0.0).unwrap(),
            ResourceAmount::ZERO
        );
        let err = "abc".parse::<ResourceAmount>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "amount must be a non-negative number such as 1, 0.5 or 2e3, got `abc`"
        );
    }

    #[test]
    fn amounts_beyond_what_ray_can_represent_are_refused_and_name_the_value() {
        for text in ["1e30", "922337203685477.5808", "99999999999999999999999"] {
            assert_eq!(
                text.parse::<ResourceAmount>(),
                Err(AmountError::TooLarge(text.into())),
                "{text}"
            );
        }
        assert!(matches!(
            ResourceAmount::try_from(1e30),
            Err(AmountError::TooLarge(_))
        ));
        let err = serde_json::from_str::<ResourceAmount>("99999999999999999999").unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        let err = serde_json::from_str::<ResourceAmount>("1000000000000000").unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        assert_eq!(
            serde_json::to_string(&ResourceAmount::MAX).unwrap(),
            "922337203685477.6",
            "the largest amount prints as a JSON number"
        );
        let largest_whole: ResourceAmount = "922337203685477".parse().unwrap();
        assert_eq!(
            serde_json::to_string(&largest_whole).unwrap(),
            "922337203685477"
        );
    }

    #[test]
    fn checked_arithmetic_reports_underflow_and_overflow() {
        assert_eq!(amount("1").checked_sub(amount("1.5")), None);
        assert_eq!(amount("1.5").checked_sub(amount("1")), Some(amount("0.5")));
        assert_eq!(
            ResourceAmount::from_steps(u128::MAX).checked_add(ResourceAmount::STEP),
            None
        );
        assert_eq!(amount("0.001").checked_mul(2), Some(amount("0.002")));
        assert_eq!(amount("4").times_fits(amount("1.5")), Some(2));
    }

    #[test]
    fn amounts_with_a_small_whole_part_survive_json_and_f64() {
        for text in ["1.5014", "0.3", "12.0001", "999.9999"] {
            let original = amount(text);
            let json = serde_json::to_string(&original).unwrap();
            assert_eq!(json, text);
            assert_eq!(
                serde_json::from_str::<ResourceAmount>(&json).unwrap(),
                original
            );
            assert_eq!(ResourceAmount::try_from(original.as_f64()), Ok(original));
        }
    }

    #[test]
    fn serde_uses_json_numbers() {
        assert_eq!(serde_json::to_string(&amount("10000")).unwrap(), "10000");
        assert_eq!(serde_json::to_string(&amount("0.5")).unwrap(), "0.5");
        assert_eq!(serde_json::to_string(&amount("0.002")).unwrap(), "0.002");
        let back: ResourceAmount = serde_json::from_str("0.3").unwrap();
        assert_eq!(back, amount("0.3"));
        let back: ResourceAmount = serde_json::from_str("\"1.25\"").unwrap();
        assert_eq!(back, amount("1.25"));
        let err = serde_json::from_str::<ResourceAmount>("-2").unwrap_err();
        assert!(
            err.to_string().contains("must not be negative, got -2"),
            "{err}"
        );
    }
}
