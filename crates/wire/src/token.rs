//! Who is who on a connection: the run's secret ([`Token`]), which side speaks ([`Role`]), and
//! the fresh numbers each side challenges the other with ([`Nonce`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use subtle::ConstantTimeEq as _;

/// The run's secret: 32 random bytes, handed to agents in their environment as hex.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; 32]);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A fresh random token.
    ///
    /// # Errors
    /// When the operating system has no randomness to give.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(Self(bytes))
    }

    /// The token as 64 hex digits.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    #[must_use]
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut bytes).ok()?;
        Some(Self(bytes))
    }

    /// The secret's bytes, which keys the handshake's proofs.
    pub(crate) const fn secret(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether `presented` (hex) is this token, compared in constant time.
    #[must_use]
    pub fn matches(&self, presented: &str) -> bool {
        Self::from_hex(presented).is_some_and(|other| bool::from(self.0.ct_eq(&other.0)))
    }
}

/// How many bytes a [`Nonce`] and a [`Proof`](crate::auth::Proof) have.
pub(crate) const LEN: usize = 32;

/// A number used once: each side's challenge to the other, 32 random bytes, hex on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce(pub(crate) [u8; LEN]);

impl Nonce {
    /// A fresh random nonce.
    ///
    /// # Errors
    /// When the operating system has no randomness to give: there is no fallback.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; LEN];
        getrandom::fill(&mut bytes)?;
        Ok(Self(bytes))
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({self})")
    }
}

impl FromStr for Nonce {
    type Err = HexError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_hex(text, "nonce").map(Self)
    }
}

hex_serde!(Nonce, Nonce::to_string);

/// Who gives a proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The driver, answering an agent's hello.
    Driver,
    /// An agent, answering the driver's challenge.
    Agent,
}

impl Role {
    /// The label that starts this role's MAC input.
    pub(crate) const fn label(self) -> &'static [u8] {
        match self {
            Self::Driver => b"trainyard/4 driver",
            Self::Agent => b"trainyard/4 agent",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Driver => "driver",
            Self::Agent => "agent",
        })
    }
}

/// A [`Nonce`] or [`Proof`](crate::auth::Proof) that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a {what} must be 64 hex digits, not {length} characters of which {invalid} are no hex digits"
)]
pub struct HexError {
    /// `"nonce"` or `"proof"`.
    pub what: &'static str,
    /// How many characters the text had.
    pub length: usize,
    /// How many of them were no hex digits.
    pub invalid: usize,
}

pub(crate) fn parse_hex(text: &str, what: &'static str) -> Result<[u8; LEN], HexError> {
    let mut bytes = [0u8; LEN];
    hex::decode_to_slice(text, &mut bytes).map_err(|_| HexError {
        what,
        length: text.chars().count(),
        invalid: text.chars().filter(|c| !c.is_ascii_hexdigit()).count(),
    })?;
    Ok(bytes)
}

macro_rules! hex_serde {
    ($type:ty, $hex:expr) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&$hex(self))
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use hex_serde;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_themselves_and_never_show_in_debug() {
        let token = Token::random().expect("randomness");
        assert!(token.matches(&token.to_hex()));
        assert!(!token.matches(&Token::random().expect("randomness").to_hex()));
        assert!(!token.matches("short"));
        assert!(!token.matches(""));
        assert!(!format!("{token:?}").contains(&token.to_hex()[..8]));
    }
}
