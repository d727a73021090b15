//! A command task's reports, counted, with the checkpoints they hand in persisted by the
//! agent: the N-th report of the task belongs to checkpoint index `base + N`
//! (`TRAINYARD_CHECKPOINT_BASE`), with a checkpoint or without, over every report
//! connection of the task. A checkpoint's files are copied into the run folder
//! (`TRAINYARD_RUN_DIR`) before the report goes on to the driver, with the [`HandIn`] that
//! says whether they were.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::Mutex;
use trainyard_checkpoint::{CHECKPOINT_BASE, CheckpointWriter, HandIn, StorageError};
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::EventSender;

/// The reports of one task; cheap to clone, one count for every clone.
#[derive(Debug, Clone)]
pub(crate) struct TaskReports {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The task's environment: the run folder and how to reach its storage.
    env: BTreeMap<String, String>,
    base: u64,
    events: EventSender,
    /// Held from counting a report until it is sent, so that reports reach the driver in the
    /// order of their indices, as it counts them.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// How many reports the task has made.
    count: u64,
    /// The task's run folder, once opened.
    writer: Option<CheckpointWriter>,
}

/// What became of one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reported {
    /// The checkpoint index the report belongs to.
    pub(crate) index: u64,
    /// Why its checkpoint was not persisted, when it was not.
    pub(crate) error: Option<String>,
}

impl TaskReports {
    /// The reports of a task started with `env`, sent to `events`.
    pub(crate) fn new(env: &BTreeMap<String, String>, events: EventSender) -> Self {
        // As `TaskContext::report_checkpoint` reads it: a base that is not a number is none.
        let base = env
            .get(CHECKPOINT_BASE)
            .and_then(|b| b.trim().parse().ok())
            .unwrap_or(0);
        Self {
            shared: Arc::new(Shared {
                env: env.clone(),
                base,
                events,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Counts a report, persists the files under `checkpoint` (an absolute directory) into
    /// its index's checkpoint, and sends the report to the driver with the hand-in; returns
    /// once it is sent.
    pub(crate) async fn report(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<&Path>,
    ) -> Reported {
        let mut state = self.shared.state.lock().await;
        state.count += 1;
        let index = self.shared.base + state.count;
        let hand_in = match checkpoint {
            None => None,
            Some(dir) => Some(self.persist(&mut state, index, dir).await),
        };
        let error = match &hand_in {
            Some(HandIn::Failed { error, .. }) => Some(error.clone()),
            _ => None,
        };
        self.shared.events.report_checkpoint(metrics, hand_in).await;
        Reported { index, error }
    }

    async fn persist(&self, state: &mut State, index: u64, dir: &Path) -> HandIn {
        let failed = |error: String| HandIn::Failed { index, error };
        if !dir.is_absolute() {
            return failed(format!(
                "a checkpoint is handed in as an absolute directory; `{}` is not one",
                dir.display()
            ));
        }
        if state.writer.is_none() {
            match CheckpointWriter::from_env(&self.shared.env) {
                Ok(writer) => state.writer = writer,
                Err(error) => return failed(ErrorChain(&error).to_string()),
            }
        }
        match &state.writer {
            Some(writer) => writer.hand_in(index, dir).await,
            None => failed(ErrorChain(&StorageError::NoRunFolder).to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use trainyard_checkpoint::RUN_DIR;
    use trainyard_runtime::TaskEvent;
    use trainyard_runtime::events::{ActorEvent, event_channel};

    use super::*;

    fn metrics(step: u64) -> serde_json::Map<String, serde_json::Value> {
        let mut metrics = serde_json::Map::new();
        metrics.insert("step".into(), step.into());
        metrics
    }

    #[tokio::test]
    async fn reports_count_from_the_base_with_a_checkpoint_or_without() {
        let (events, mut stream) = event_channel(16);
        let env = BTreeMap::from([(CHECKPOINT_BASE.to_owned(), "7".to_owned())]);
        let reports = TaskReports::new(&env, events);
        let again = reports.clone();
        assert_eq!(
            reports.report(metrics(1), None).await,
            Reported {
                index: 8,
                error: None
            }
        );
        // No run folder: the checkpoint fails, and the index is taken all the same.
        let failed = again.report(metrics(2), Some(Path::new("/tmp"))).await;
        assert_eq!(failed.index, 9);
        let error = failed.error.expect("no run folder to persist in");
        assert!(error.contains("TRAINYARD_RUN_DIR"), "{error}");
        assert_eq!(reports.report(metrics(3), None).await.index, 10);

        let first = stream.next().await;
        assert_eq!(
            first,
            Some(ActorEvent::Task(TaskEvent::Report {
                metrics: metrics(1),
                checkpoint: None
            }))
        );
        let second = stream.next().await;
        assert_eq!(
            second,
            Some(ActorEvent::Task(TaskEvent::Report {
                metrics: metrics(2),
                checkpoint: Some(HandIn::Failed { index: 9, error })
            }))
        );
    }

    #[tokio::test]
    async fn a_relative_checkpoint_directory_fails_without_touching_storage() {
        let (events, _stream) = event_channel(16);
        let env = BTreeMap::from([(RUN_DIR.to_owned(), "/nowhere/run".to_owned())]);
        let reports = TaskReports::new(&env, events);
        let reported = reports.report(metrics(1), Some(Path::new("ckpt"))).await;
        assert_eq!(reported.index, 1);
        assert!(
            reported
                .error
                .as_deref()
                .is_some_and(|e| e.contains("`ckpt`")),
            "{reported:?}"
        );
    }
}
