//! Byte sizes for `memory` and `object_store_memory`: `10000`, `1e9`, `"10GB"`, `"1.5 GiB"`.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::decimal::{Decimal, DecimalError};

/// The units a byte size may carry, matched case-insensitively.
pub const BYTE_UNITS: [(&str, u128); 9] = [
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// A whole number of bytes.
///
/// Plain numbers are bytes (`10000`, `1e9`); text may carry a unit — `B`, `KB` `MB` `GB` `TB`
/// (powers of 1000) or `KiB` `MiB` `GiB` `TiB` (powers of 1024), in any case, with or without
/// a space. A fractional result is rounded toward zero, as Ray does with `int(memory)`, except
/// that a size that is not zero never rounds to zero bytes: `0.5B` is an error.
///
/// ```
/// use trainyard_resources::ByteSize;
///
/// assert_eq!("10GB".parse::<ByteSize>()?.bytes(), 10_000_000_000);
/// assert_eq!("1.5 GiB".parse::<ByteSize>()?.bytes(), 1_610_612_736);
/// assert_eq!("1e9".parse::<ByteSize>()?.bytes(), 1_000_000_000);
/// # Ok::<(), trainyard_resources::ByteSizeError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

/// Why a value is not a byte size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ByteSizeError {
    /// Not a number, optionally followed by a known unit.
    #[error(
        "`{0}` is not a byte size: expected a number of bytes, or a number with one of the units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
    )]
    Syntax(String),
    /// Below zero.
    #[error("a byte size must not be negative, got `{0}`")]
    Negative(String),
    /// More than `u64::MAX` bytes.
    #[error("`{0}` is too many bytes")]
    TooLarge(String),
    /// More than zero but less than one byte, which would round down to nothing.
    #[error("`{0}` is less than one byte: give 0, or at least 1B")]
    BelowOneByte(String),
}

impl ByteSize {
    /// `bytes` bytes.
    #[must_use]
    pub const fn new(bytes: u64) -> Self {
        Self(bytes)
    }

    /// The number of bytes.
    #[must_use]
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Converts a number of bytes given as a float (`1e9`), rounding toward zero.
    ///
    /// # Errors
    /// NaN, infinities, negative values and values above `u64::MAX`.
    pub fn from_f64(value: f64) -> Result<Self, ByteSizeError> {
        if value.is_nan() || value.is_infinite() {
            return Err(ByteSizeError::Syntax(value.to_string()));
        }
        if value < 0.0 {
            return Err(ByteSizeError::Negative(value.to_string()));
        }
        value.to_string().parse()
    }
}

impl From<u64> for ByteSize {
    fn from(bytes: u64) -> Self {
        Self(bytes)
    }
}

impl From<ByteSize> for u64 {
    fn from(size: ByteSize) -> Self {
        size.0
    }
}

impl fmt::Display for ByteSize {
    /// The number of bytes (`10000000000`); with `{:#}`, the exact size in the unit that
    /// gives the smallest number (`10GB`, `1536MiB`, `7B`). Both parse back to the same size.
    ///
    /// ```
    /// use trainyard_resources::ByteSize;
    ///
    /// assert_eq!(format!("{:#}", ByteSize::new(10_000_000_000)), "10GB");
    /// assert_eq!(format!("{:#}", ByteSize::new(1_610_612_736)), "1536MiB");
    /// assert_eq!(format!("{:#}", ByteSize::new(1_001)), "1001B");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() || self.0 == 0 {
            return write!(f, "{}", self.0);
        }
        let bytes = u128::from(self.0);
        let (unit, count) = BYTE_UNITS
            .iter()
            .filter(|(_, factor)| bytes % factor == 0)
            .map(|&(unit, factor)| (unit, bytes / factor))
            .min_by_key(|&(_, count)| count)
            .unwrap_or(("B", bytes));
        write!(f, "{count}{unit}")
    }
}

impl ByteSize {
    /// The size as a person reads it, the one rendering of byte sizes in text output. It is
    /// exact where a unit gives a short number — at most four digits and one decimal
    /// (`10GB`, `1.5GiB`, `1000KiB`, `7B`) — and otherwise rounded to a tenth of the
    /// largest binary unit that leaves a number below 1024 (`23.5GiB`). JSON keeps bytes.
    ///
    /// ```
    /// use trainyard_resources::ByteSize;
    ///
    /// assert_eq!(ByteSize::new(25_276_063_744).human().to_string(), "23.5GiB");
    /// assert_eq!(ByteSize::new(10_000_000_000).human().to_string(), "10GB");
    /// assert_eq!(ByteSize::new(1_610_612_736).human().to_string(), "1.5GiB");
    /// assert_eq!(ByteSize::new(0).human().to_string(), "0B");
    /// ```
    #[must_use]
    pub const fn human(self) -> HumanBytes {
        HumanBytes(self.0)
    }
}

/// A byte size shown as a person reads it; see [`ByteSize::human`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanBytes(u64);

/// The most digits before the point of an exact rendering; longer ones are rounded.
const EXACT_LIMIT: u128 = 10_000;

/// The binary units, smallest first, for rounded renderings.
const BINARY_UNITS: [(&str, u128); 5] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = u128::from(self.0);
        // Exact to a tenth, in the unit with the smallest count.
        let exact = BYTE_UNITS
            .iter()
            .filter(|&&(_, factor)| (bytes * 10) % factor == 0 && (bytes >= factor || factor == 1))
            .map(|&(unit, factor)| (unit, bytes * 10 / factor))
            .min_by_key(|&(_, tenths)| tenths)
            .filter(|&(_, tenths)| tenths < EXACT_LIMIT * 10);
        let (unit, tenths) = exact.unwrap_or_else(|| {
            // Rounded to a tenth, in the smallest unit that leaves less than 1024 (the
            // largest unit for what is larger still).
            let rounded = |factor: u128| (bytes * 10 + factor / 2) / factor;
            BINARY_UNITS
                .iter()
                .map(|&(unit, factor)| (unit, rounded(factor)))
                .find(|&(_, tenths)| tenths < 10_240)
                .unwrap_or(("TiB", rounded(1 << 40)))
        });
        match tenths % 10 {
            0 if exact.is_some() => write!(f, "{}{unit}", tenths / 10),
            tenth => write!(f, "{}.{tenth}{unit}", tenths / 10),
        }
    }
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let factor = if unit.is_empty() {
            1
        } else {
            BYTE_UNITS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(unit))
                .map(|&(_, factor)| factor)
                .ok_or_else(|| ByteSizeError::Syntax(text.to_owned()))?
        };
        let decimal = Decimal::parse(number.trim_end()).map_err(|e| match e {
            DecimalError::Syntax => ByteSizeError::Syntax(text.to_owned()),
            DecimalError::Negative => ByteSizeError::Negative(trimmed.to_owned()),
            DecimalError::TooLarge => ByteSizeError::TooLarge(trimmed.to_owned()),
        })?;
        let bytes = decimal
            .scaled_truncated(factor)
            .ok()
            .and_then(|b| u64::try_from(b).ok())
            .ok_or_else(|| ByteSizeError::TooLarge(trimmed.to_owned()))?;
        if bytes == 0 && !decimal.is_zero() {
            return Err(ByteSizeError::BelowOneByte(trimmed.to_owned()));
        }
        Ok(Self(bytes))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    /// Accepts a number of bytes or a string with a unit.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ByteSizeVisitor)
    }
}

struct ByteSizeVisitor;

impl Visitor<'_> for ByteSizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number of bytes or a string such as \"10GB\" or \"1.5 GiB\"")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(ByteSize(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v)
            .map(ByteSize)
            .map_err(|_| E::custom(ByteSizeError::Negative(v.to_string())))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        ByteSize::from_f64(v).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        v.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(text: &str) -> u64 {
        text.parse::<ByteSize>().unwrap().bytes()
    }

    #[test]
    fn plain_numbers_are_bytes() {
        assert_eq!(bytes("10000"), 10_000);
        assert_eq!(bytes("1e9"), 1_000_000_000);
        assert_eq!(ByteSize::from_f64(1e9).unwrap().bytes(), 1_000_000_000);
        assert_eq!(bytes("1000.9"), 1000);
    }

    #[test]
    fn decimal_and_binary_units_in_any_case_with_optional_space() {
        assert_eq!(bytes("10GB"), 10_000_000_000);
        assert_eq!(bytes("10 gb"), 10_000_000_000);
        assert_eq!(bytes("512MiB"), 512 * 1024 * 1024);
        assert_eq!(bytes("1.5 GiB"), 1_610_612_736);
        assert_eq!(bytes("2kib"), 2048);
        assert_eq!(bytes("1TB"), 1_000_000_000_000);
        assert_eq!(bytes("3 TiB"), 3 << 40);
        assert_eq!(bytes("7B"), 7);
        assert_eq!(bytes("1e3 KB"), 1_000_000);
    }

    #[test]
    fn the_alternate_form_uses_the_largest_exact_unit_and_parses_back() {
        for (size, text) in [
            (0, "0"),
            (7, "7B"),
            (2048, "2KiB"),
            (1_024_000, "1000KiB"),
            (3 << 40, "3TiB"),
        ] {
            let shown = format!("{:#}", ByteSize::new(size));
            assert_eq!(shown, text);
            assert_eq!(bytes(&shown), size);
        }
    }

    #[test]
    fn the_human_form_is_exact_when_short_and_rounded_to_a_tenth_otherwise() {
        for (size, text) in [
            (0, "0B"),
            (7, "7B"),
            (1000, "1KB"),
            (1001, "1001B"),
            (2048, "2KiB"),
            (1_024_000, "1000KiB"),
            (1536 << 20, "1.5GiB"),
            (10_000_000_000, "10GB"),
            (3 << 40, "3TiB"),
            (25_276_063_744, "23.5GiB"),
            (24_683_656 * 1024, "23.5GiB"),
            (123_456_789, "117.7MiB"),
            ((1 << 30) - 1, "1.0GiB"),
            (u64::MAX, "16777216.0TiB"),
        ] {
            assert_eq!(ByteSize::new(size).human().to_string(), text, "{size}");
        }
    }

    #[test]
    fn a_size_below_one_byte_is_refused_but_zero_is_zero() {
        for text in ["0.5B", "0.5", "1e-3", "0.0001 KB"] {
            assert_eq!(
                text.parse::<ByteSize>(),
                Err(ByteSizeError::BelowOneByte(text.to_owned())),
                "{text}"
            );
        }
        assert_eq!(bytes("0"), 0);
        assert_eq!(bytes("0GB"), 0);
        assert_eq!(
            bytes("1.5B"),
            1,
            "larger sizes round toward zero, as Ray does"
        );
    }

    #[test]
    fn bad_sizes_name_the_value() {
        let err = "ten GB".parse::<ByteSize>().unwrap_err();
        assert_eq!(err, ByteSizeError::Syntax("ten GB".into()));
        assert!(err.to_string().contains("KiB"));
        assert_eq!(
            "10 XB".parse::<ByteSize>(),
            Err(ByteSizeError::Syntax("10 XB".into()))
        );
        assert_eq!(
            "GB".parse::<ByteSize>(),
            Err(ByteSizeError::Syntax("GB".into()))
        );
        assert_eq!(
            "-1GB".parse::<ByteSize>(),
            Err(ByteSizeError::Negative("-1GB".into()))
        );
        assert!(matches!(
            "1e30".parse::<ByteSize>(),
            Err(ByteSizeError::TooLarge(_))
        ));
    }
}
