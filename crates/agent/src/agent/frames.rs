//! The agent's connection once it is authenticated: a reader that hands the driver's
//! requests to the agent and its credit to the writer, and a writer that sends replies at
//! once, events while the driver's credit lasts, and heartbeats.

use std::time::Duration;

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio_util::bytes::Bytes;
use trainyard_runtime::Request;
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage};

use crate::agent::connect::Link;
use crate::diagnostics::Diagnostics;

/// Reads the driver's messages: requests go to the agent, credit to the writer. Ends (and
/// with it the agent's requests, so that the agent stops its task and exits) when the
/// connection does, when a message is not understood, or when nothing at all came from the
/// driver for `lost` (its lost-driver bound: the driver says it is alive far more often),
/// saying why through `diagnostics`.
pub(super) async fn read_frames(
    mut frames: SplitStream<Link>,
    requests: mpsc::UnboundedSender<(u64, Request)>,
    credits: mpsc::UnboundedSender<Credit>,
    diagnostics: Diagnostics,
    lost: Duration,
) {
    loop {
        let Ok(frame) = tokio::time::timeout(lost, frames.next()).await else {
            diagnostics.diagnose(format_args!(
                "trainyard agent: nothing came from the driver for {} s: it is taken for lost, and the task is stopped",
                lost.as_secs_f64()
            ));
            return;
        };
        let Some(frame) = frame else {
            return;
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                // A frame that fails its seal was not sent by the driver: nothing of it runs.
                diagnostics.diagnose(format_args!(
                    "trainyard agent: the connection to the driver broke: {error}"
                ));
                return;
            }
        };
        match wire::decode(&frame) {
            Ok(DriverMessage::Request { id, request }) => {
                if requests.send((id, request)).is_err() {
                    return;
                }
            }
            Ok(DriverMessage::Credit { events, bytes }) => {
                // The writer is gone only when the agent ends.
                let _ = credits.send(Credit { events, bytes });
            }
            Ok(DriverMessage::Heartbeat) => {}
            Ok(DriverMessage::Challenge { .. }) => {
                diagnostics.diagnose("trainyard agent: the driver sent a second challenge");
                return;
            }
            Err(error) => {
                diagnostics.diagnose(format_args!(
                    "trainyard agent: a message from the driver is not understood: {error}"
                ));
                return;
            }
        }
    }
}

/// Room the driver grants for events ([`DriverMessage::Credit`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Credit {
    events: u32,
    bytes: u64,
}

/// What the writer sends.
pub(super) struct Outgoing {
    /// Replies, sent as soon as they are made.
    pub(super) replies: mpsc::Receiver<AgentMessage>,
    /// The task's events, sent while the driver's credit lasts.
    pub(super) events: TaskEvents,
    /// Credit the driver grants.
    pub(super) credits: mpsc::UnboundedReceiver<Credit>,
}

/// Writes replies at once, events while there is credit, and a heartbeat every `heartbeat`,
/// until the replies and the events have ended (or the connection has).
pub(super) async fn write_frames(
    mut sink: SplitSink<Link, Bytes>,
    outgoing: Outgoing,
    heartbeat: Duration,
) {
    let Outgoing {
        mut replies,
        mut events,
        mut credits,
    } = outgoing;
    let (mut replies_open, mut events_open, mut credits_open) = (true, true, true);
    // Events and bytes the driver has room for; the last event sent may take the bytes
    // below zero.
    let mut credit: u64 = 0;
    let mut credit_bytes: i64 = 0;
    let mut beat = tokio::time::interval(heartbeat);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while replies_open || events_open {
        let message = tokio::select! {
            biased;
            reply = replies.recv(), if replies_open => match reply {
                Some(reply) => reply,
                None => {
                    replies_open = false;
                    continue;
                }
            },
            granted = credits.recv(), if credits_open => {
                match granted {
                    Some(granted) => {
                        credit = credit.saturating_add(u64::from(granted.events));
                        credit_bytes = credit_bytes
                            .saturating_add(i64::try_from(granted.bytes).unwrap_or(i64::MAX));
                    }
                    None => credits_open = false,
                }
                continue;
            }
            _ = beat.tick() => AgentMessage::Heartbeat,
            event = events.next(), if events_open && credit > 0 && credit_bytes > 0 => match event {
                Some(ActorEvent::Task { attempt, event }) => {
                    credit -= 1;
                    AgentMessage::Event { attempt, event }
                }
                Some(ActorEvent::TaskExited { attempt, exit }) => {
                    credit -= 1;
                    AgentMessage::TaskExited { attempt, exit }
                }
                Some(ActorEvent::Died(_)) => continue,
                None => {
                    events_open = false;
                    continue;
                }
            },
        };
        let Ok(frame) = wire::encode(&message) else {
            continue;
        };
        if matches!(
            message,
            AgentMessage::Event { .. } | AgentMessage::TaskExited { .. }
        ) {
            credit_bytes =
                credit_bytes.saturating_sub(i64::try_from(frame.len()).unwrap_or(i64::MAX));
        }
        if sink.send(frame).await.is_err() {
            break;
        }
    }
    let _ = sink.close().await;
}
