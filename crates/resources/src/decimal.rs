//! Exact parsing of decimal text (`"1.5"`, `"2e3"`, `"0.0001"`) into an integer mantissa and
//! a power of ten, so that amounts and byte sizes never pass through binary floating point.

/// A non-negative decimal number `mantissa × 10^exponent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decimal {
    pub(crate) mantissa: u128,
    pub(crate) exponent: i32,
}

/// Why a text is not a decimal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecimalError {
    /// Not of the form `digits[.digits][e[+-]digits]`.
    Syntax,
    /// Starts with a minus sign (the rest is a valid number).
    Negative,
    /// More significant digits than fit.
    TooLarge,
}

impl Decimal {
    /// Parses `digits[.digits][(e|E)[+|-]digits]`, with an optional leading `+`.
    /// A leading `-` followed by a valid number is reported as [`DecimalError::Negative`].
    pub(crate) fn parse(text: &str) -> Result<Self, DecimalError> {
        if let Some(rest) = text.strip_prefix('-') {
            // One sign only: `--1` and `-+1` are not numbers.
            if rest.starts_with(['-', '+']) {
                return Err(DecimalError::Syntax);
            }
            let parsed = Self::parse(rest)?;
            return if parsed.mantissa == 0 {
                Ok(parsed)
            } else {
                Err(DecimalError::Negative)
            };
        }
        let text = text.strip_prefix('+').unwrap_or(text);
        let (number, exp_text) = match text.find(['e', 'E']) {
            Some(at) => (&text[..at], Some(&text[at + 1..])),
            None => (text, None),
        };
        let (whole, fraction) = match number.split_once('.') {
            Some((whole, fraction)) => (whole, fraction),
            None => (number, ""),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(DecimalError::Syntax);
        }
        if !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        {
            return Err(DecimalError::Syntax);
        }
        let mut exponent: i32 = match exp_text {
            None => 0,
            Some(exp) => {
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(DecimalError::Syntax);
                }
                exp.parse().map_err(|_| DecimalError::TooLarge)?
            }
        };
        // Trailing zeros of the fraction carry no information.
        let fraction = fraction.trim_end_matches('0');
        let mut mantissa: u128 = 0;
        for digit in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(digit - b'0')))
                .ok_or(DecimalError::TooLarge)?;
        }
        let fraction_len = i32::try_from(fraction.len()).map_err(|_| DecimalError::TooLarge)?;
        exponent = exponent
            .checked_sub(fraction_len)
            .ok_or(DecimalError::TooLarge)?;
        Ok(Self { mantissa, exponent })
    }

    /// `self × factor`, exactly, when the result is a whole number that fits;
    /// `Ok(None)` when it is not whole.
    pub(crate) fn scaled_exact(self, factor: u128) -> Result<Option<u128>, DecimalError> {
        let (numerator, divisor) = self.fraction(factor)?;
        Ok((numerator % divisor == 0).then_some(numerator / divisor))
    }

    /// `self × factor`, rounded toward zero.
    /// Whether the number is zero.
    pub(crate) const fn is_zero(self) -> bool {
        self.mantissa == 0
    }

    pub(crate) fn scaled_truncated(self, factor: u128) -> Result<u128, DecimalError> {
        let (numerator, divisor) = self.fraction(factor)?;
        Ok(numerator / divisor)
    }

    fn fraction(self, factor: u128) -> Result<(u128, u128), DecimalError> {
        if self.mantissa == 0 {
            return Ok((0, 1));
        }
        if self.exponent >= 0 {
            let numerator = 10u128
                .checked_pow(self.exponent.unsigned_abs())
                .and_then(|power| self.mantissa.checked_mul(power))
                .and_then(|n| n.checked_mul(factor))
                .ok_or(DecimalError::TooLarge)?;
            return Ok((numerator, 1));
        }
        let Some(power) = 10u128.checked_pow(self.exponent.unsigned_abs()) else {
            // Smaller than any representable step: rounds to zero, is never whole.
            return Ok((1, 2));
        };
        // Cancel what `factor` and the power of ten share before multiplying, so that a value
        // whose scaled result fits is not rejected because `mantissa × factor` would not.
        let common = gcd(factor, power);
        let numerator = self
            .mantissa
            .checked_mul(factor / common)
            .ok_or(DecimalError::TooLarge)?;
        Ok((numerator, power / common))
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_fractional_and_exponent_forms() {
        assert_eq!(
            Decimal::parse("15").unwrap(),
            Decimal {
                mantissa: 15,
                exponent: 0
            }
        );
        assert_eq!(
            Decimal::parse("1.50").unwrap(),
            Decimal {
                mantissa: 15,
                exponent: -1
            }
        );
        assert_eq!(
            Decimal::parse(".5").unwrap(),
            Decimal {
                mantissa: 5,
                exponent: -1
            }
        );
        assert_eq!(
            Decimal::parse("5.").unwrap(),
            Decimal {
                mantissa: 5,
                exponent: 0
            }
        );
        assert_eq!(
            Decimal::parse("1e9").unwrap(),
            Decimal {
                mantissa: 1,
                exponent: 9
            }
        );
        assert_eq!(
            Decimal::parse("2.5E-3").unwrap(),
            Decimal {
                mantissa: 25,
                exponent: -4
            }
        );
        assert_eq!(
            Decimal::parse("-0").unwrap(),
            Decimal {
                mantissa: 0,
                exponent: 0
            }
        );
    }

    #[test]
    fn rejects_what_is_not_a_number() {
        for bad in [
            "", ".", "e5", "1e", "1.2.3", "abc", "1 ", "0x10", "1e+", "--1",
        ] {
            assert_eq!(Decimal::parse(bad), Err(DecimalError::Syntax), "{bad:?}");
        }
        assert_eq!(Decimal::parse("-1"), Err(DecimalError::Negative));
    }

    #[test]
    fn scaling_is_exact() {
        let d = Decimal::parse("0.0001").unwrap();
        assert_eq!(d.scaled_exact(10_000).unwrap(), Some(1));
        let d = Decimal::parse("0.00015").unwrap();
        assert_eq!(d.scaled_exact(10_000).unwrap(), None);
        assert_eq!(d.scaled_truncated(10_000).unwrap(), 1);
        let d = Decimal::parse("1e-400").unwrap();
        assert_eq!(d.scaled_exact(10_000).unwrap(), None);
    }
}
