//! Mutual authentication of the driver and an agent: each proves that it holds the run's
//! secret ([`Token`]) without sending it.
//!
//! Each side picks a fresh [`Nonce`] for the connection. A [`Proof`] is an HMAC-SHA256
//! under the secret over a role's label, both nonces (the prover's peer's first), the actor
//! and the agent's pid, all of fixed width:
//!
//! ```text
//! driver proof = HMAC(secret, "trainyard/4 driver" || agent nonce  || driver nonce || actor (u64 BE) || pid (u32 BE))
//! agent proof  = HMAC(secret, "trainyard/4 agent"  || driver nonce || agent nonce  || actor (u64 BE) || pid (u32 BE))
//! ```
//!
//! A proof is good for one connection only (the peer's nonce is fresh), for one actor and
//! agent process, and for one role: the driver's answer can never be replayed as an
//! agent's, nor the other way round. Proofs are checked in constant time.
//!
//! ```
//! use trainyard_wire::auth::Handshake;
//! use trainyard_wire::token::{Nonce, Role, Token};
//! use trainyard_runtime::ActorId;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = Token::random()?;
//! let handshake = Handshake {
//!     agent_nonce: Nonce::random()?,
//!     driver_nonce: Nonce::random()?,
//!     actor: ActorId(7),
//!     pid: 4242,
//! };
//! let proof = handshake.prove(&secret, Role::Driver);
//! handshake.verify(&secret, Role::Driver, &proof)?;
//! assert!(handshake.verify(&secret, Role::Agent, &proof).is_err());
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, KeyInit as _, Mac as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;
use subtle::ConstantTimeEq as _;
use trainyard_runtime::ActorId;

use crate::seal::SessionKey;
use crate::token::{HexError, LEN, Nonce, Role, Token, hex_serde, parse_hex};

type HmacSha256 = Hmac<Sha256>;

/// What one side sends to prove it holds the run's secret: an HMAC-SHA256 tag, hex on the
/// wire. Compared in constant time; never shown by `Debug`.
#[derive(Clone)]
pub struct Proof([u8; LEN]);

impl Proof {
    /// The proof as 64 hex digits, as it goes on the wire.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Proof(..)")
    }
}

impl PartialEq for Proof {
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl Eq for Proof {}

impl FromStr for Proof {
    type Err = HexError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_hex(text, "proof").map(Self)
    }
}

hex_serde!(Proof, Proof::to_hex);

/// What both sides' proofs cover: one connection's handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    /// The agent's nonce, sent in its hello.
    pub agent_nonce: Nonce,
    /// The driver's nonce, sent in its challenge.
    pub driver_nonce: Nonce,
    /// The actor the agent serves.
    pub actor: ActorId,
    /// The agent's process id.
    pub pid: u32,
}

impl Handshake {
    /// The MAC of this handshake for `role`, not finalised yet.
    fn mac(&self, secret: &Token, role: Role) -> HmacSha256 {
        // HMAC takes a key of any length: this never fails.
        let mut mac = HmacSha256::new_from_slice(secret.secret()).expect("HMAC takes any key");
        let (first, second) = match role {
            Role::Driver => (&self.agent_nonce, &self.driver_nonce),
            Role::Agent => (&self.driver_nonce, &self.agent_nonce),
        };
        mac.update(role.label());
        mac.update(&first.0);
        mac.update(&second.0);
        mac.update(&self.actor.0.to_be_bytes());
        mac.update(&self.pid.to_be_bytes());
        mac
    }

    /// The key that seals the frames of this handshake's connection ([`crate::seal`]):
    /// an HMAC-SHA256 under `secret` over its own label, both nonces, the actor and the pid,
    /// so that both ends, and only they, can make it.
    #[must_use]
    pub fn session_key(&self, secret: &Token) -> SessionKey {
        // HMAC takes a key of any length: this never fails.
        let mut mac = HmacSha256::new_from_slice(secret.secret()).expect("HMAC takes any key");
        mac.update(b"trainyard/4 session");
        mac.update(&self.agent_nonce.0);
        mac.update(&self.driver_nonce.0);
        mac.update(&self.actor.0.to_be_bytes());
        mac.update(&self.pid.to_be_bytes());
        SessionKey(mac.finalize().into_bytes().into())
    }

    /// The proof `role` gives for this handshake, holding `secret`.
    #[must_use]
    pub fn prove(&self, secret: &Token, role: Role) -> Proof {
        Proof(self.mac(secret, role).finalize().into_bytes().into())
    }

    /// Checks, in constant time, that `proof` is `role`'s proof for this handshake under
    /// `secret`.
    ///
    /// # Errors
    /// [`WrongProof`] when it is not.
    pub fn verify(&self, secret: &Token, role: Role, proof: &Proof) -> Result<(), WrongProof> {
        self.mac(secret, role)
            .verify_slice(&proof.0)
            .map_err(|_| WrongProof { role })
    }
}

/// A proof that does not check: its sender does not hold the run's secret, or it answers
/// another connection's challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {role} could not prove it holds the run's secret")]
pub struct WrongProof {
    /// Whose proof it was.
    pub role: Role,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake() -> Handshake {
        Handshake {
            agent_nonce: Nonce::random().expect("randomness"),
            driver_nonce: Nonce::random().expect("randomness"),
            actor: ActorId(3),
            pid: 77,
        }
    }

    fn secret() -> Token {
        Token::random().expect("randomness")
    }

    #[test]
    fn each_role_proves_its_own_handshake_and_the_proofs_differ_by_role() {
        let (secret, handshake) = (secret(), handshake());
        let driver = handshake.prove(&secret, Role::Driver);
        let agent = handshake.prove(&secret, Role::Agent);
        assert_ne!(driver, agent);
        assert_eq!(handshake.verify(&secret, Role::Driver, &driver), Ok(()));
        assert_eq!(handshake.verify(&secret, Role::Agent, &agent), Ok(()));
        assert_eq!(
            handshake.verify(&secret, Role::Agent, &driver),
            Err(WrongProof { role: Role::Agent })
        );
        assert_eq!(
            handshake.verify(&secret, Role::Driver, &agent),
            Err(WrongProof { role: Role::Driver })
        );
    }

    #[test]
    fn swapping_the_nonces_does_not_turn_one_role_into_the_other() {
        let (secret, handshake) = (secret(), handshake());
        let swapped = Handshake {
            agent_nonce: handshake.driver_nonce,
            driver_nonce: handshake.agent_nonce,
            ..handshake
        };
        let driver = handshake.prove(&secret, Role::Driver);
        assert!(swapped.verify(&secret, Role::Agent, &driver).is_err());
        assert!(swapped.verify(&secret, Role::Driver, &driver).is_err());
    }

    #[test]
    fn a_tampered_nonce_actor_or_pid_or_another_secret_fails() {
        let (secret, handshake) = (secret(), handshake());
        for role in [Role::Driver, Role::Agent] {
            let proof = handshake.prove(&secret, role);
            let fresh = Nonce::random().expect("randomness");
            let tampered = [
                Handshake {
                    agent_nonce: fresh,
                    ..handshake
                },
                Handshake {
                    driver_nonce: fresh,
                    ..handshake
                },
                Handshake {
                    actor: ActorId(4),
                    ..handshake
                },
                Handshake {
                    pid: 78,
                    ..handshake
                },
            ];
            for other in tampered {
                assert_eq!(
                    other.verify(&secret, role, &proof),
                    Err(WrongProof { role }),
                    "{other:?}"
                );
            }
            assert!(handshake.verify(&self::secret(), role, &proof).is_err());
        }
    }

    #[test]
    fn proofs_are_hmac_sha256_over_fixed_width_fields() {
        // Key 0x00..=0x1f, nonces of 0x11s (agent) and 0x22s (driver), actor 5, pid 6; the
        // expected tags are Python's `hmac.new(key, label + ..., hashlib.sha256)`.
        let secret = Token::from_hex(&hex::encode((0u8..32).collect::<Vec<_>>())).expect("hex");
        let handshake = Handshake {
            agent_nonce: Nonce([0x11; LEN]),
            driver_nonce: Nonce([0x22; LEN]),
            actor: ActorId(5),
            pid: 6,
        };
        assert_eq!(
            handshake.prove(&secret, Role::Driver).to_hex(),
            "be69d7f24e5bf0cfa055f7f55e80eedb226a0f548f8dde24a30782a524f2934b"
        );
        assert_eq!(
            handshake.prove(&secret, Role::Agent).to_hex(),
            "2b2e30d8ccee61eaa8e5a01b92670de5c50fbd747b180b6fdb11db7ae5a37253"
        );
    }

    #[test]
    fn nonces_and_proofs_travel_as_hex_and_bad_hex_is_refused_without_echo() {
        let nonce = Nonce::random().expect("randomness");
        let json = serde_json::to_string(&nonce).expect("serialise");
        assert_eq!(json, format!("\"{nonce}\""));
        assert_eq!(serde_json::from_str::<Nonce>(&json).expect("parse"), nonce);

        let proof = handshake().prove(&secret(), Role::Agent);
        let json = serde_json::to_string(&proof).expect("serialise");
        assert_eq!(serde_json::from_str::<Proof>(&json).expect("parse"), proof);
        assert_eq!(format!("{proof:?}"), "Proof(..)");

        let error = "zz".parse::<Proof>().expect_err("not hex");
        assert_eq!(
            error.to_string(),
            "a proof must be 64 hex digits, not 2 characters of which 2 are no hex digits"
        );
        assert!("ab".repeat(31).parse::<Nonce>().is_err());
        assert!(serde_json::from_str::<Nonce>("17").is_err());
    }
}
