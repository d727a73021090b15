//! The protocol between the trainyard driver and its worker agents, and how a runtime starts
//! an agent: what both sides must agree on, and nothing of either side's own work.
//!
//! A real runtime (such as `trainyard-runtime-local`) starts one agent process per worker
//! (the `trainyard-agent` crate), configured through its environment ([`config`]) and given
//! the run's secret [`Token`](token::Token) on its stdin. The agent connects back to the
//! driver; each proves to the other that it holds the secret without sending it ([`auth`]:
//! HMAC-SHA256 over fresh nonces), and from then on every frame is sealed ([`seal`]) under a
//! key only the two ends of that connection can derive. The messages themselves are JSON in
//! length-delimited frames ([`wire`]). A listener that serves only authenticated peers admits
//! the connections that have not proved themselves yet through [`admission`].
//!
//! # Speak the wire protocol
//!
//! ```
//! use futures::{SinkExt, StreamExt};
//! use trainyard_wire::auth::Handshake;
//! use trainyard_wire::token::{Nonce, Role, Token};
//! use trainyard_wire::wire::{self, AgentMessage, DriverMessage, PROTOCOL};
//! use trainyard_runtime::{ActorId, Request};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let token = Token::random()?; // both sides hold it; it never crosses the wire
//! let (driver_end, agent_end) = tokio::io::duplex(64 * 1024); // a TCP stream, in real life
//! let (mut driver, mut agent) = (wire::framed(driver_end), wire::framed(agent_end));
//!
//! // The agent speaks first: which actor it serves, and a fresh nonce.
//! let (actor, pid, agent_nonce) = (ActorId(0), std::process::id(), Nonce::random()?);
//! let hello = AgentMessage::Hello { protocol: PROTOCOL, actor, pid, nonce: agent_nonce };
//! agent.send(wire::encode(&hello)?).await?;
//!
//! // The driver answers with a nonce of its own and its proof over both.
//! let frame = driver.next().await.ok_or("the agent hung up")??;
//! let AgentMessage::Hello { nonce, .. } = wire::decode(&frame)? else {
//!     return Err("expected a hello".into());
//! };
//! let handshake = Handshake { agent_nonce: nonce, driver_nonce: Nonce::random()?, actor, pid };
//! let proof = handshake.prove(&token, Role::Driver);
//! let challenge = DriverMessage::Challenge { nonce: handshake.driver_nonce, proof };
//! driver.send(wire::encode(&challenge)?).await?;
//!
//! // The agent checks the driver's proof, then proves itself.
//! let frame = agent.next().await.ok_or("the driver hung up")??;
//! let DriverMessage::Challenge { nonce, proof } = wire::decode(&frame)? else {
//!     return Err("expected a challenge".into());
//! };
//! let seen = Handshake { agent_nonce, driver_nonce: nonce, actor, pid };
//! seen.verify(&token, Role::Driver, &proof)?;
//! let answer = AgentMessage::Proof { proof: seen.prove(&token, Role::Agent) };
//! agent.send(wire::encode(&answer)?).await?;
//!
//! // The driver checks it before it accepts frames larger than a handshake's.
//! let frame = driver.next().await.ok_or("the agent hung up")??;
//! let AgentMessage::Proof { proof } = wire::decode(&frame)? else {
//!     return Err("expected a proof".into());
//! };
//! handshake.verify(&token, Role::Agent, &proof)?;
//! wire::authenticated(&mut driver, &handshake.session_key(&token), Role::Driver);
//! wire::authenticated(&mut agent, &seen.session_key(&token), Role::Agent);
//! let request = DriverMessage::Request { id: 1, request: Request::NodeInfo };
//! driver.send(wire::encode(&request)?).await?;
//! # Ok(()) }
//! ```
//!
//! # Main items
//!
//! - [`token`]: [`Token`](token::Token) (the run's secret), [`Role`](token::Role) (driver or
//!   agent) and [`Nonce`](token::Nonce): who is who on a connection.
//! - [`wire`]: [`DriverMessage`](wire::DriverMessage) and [`AgentMessage`](wire::AgentMessage)
//!   in JSON frames; [`auth`]: the proofs of the handshake; [`seal`]: the frames after it.
//! - [`config`]: how an agent is started ([`AgentConfig`](config::AgentConfig), the
//!   variables of its environment, [`token_line`](config::token_line)).
//! - [`admission`]: connections that have not authenticated yet, evicted oldest first.
//! - [`warm`]: a warm Python ([`WarmZygote`](warm::WarmZygote)), which starts Python tasks as
//!   forks of an interpreter that imported the run's heavy modules once; the local runtime
//!   starts one next to its driver, an agent on another host one of its own.
//! - With the `testing` feature, `testing::start_agent` starts a test binary again as an
//!   agent, for tests that play the driver.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

pub mod admission;
pub mod auth;
pub mod config;
pub mod seal;
#[cfg(feature = "testing")]
pub mod testing;
pub mod token;
pub mod warm;
pub mod wire;
