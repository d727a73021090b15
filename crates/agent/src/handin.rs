//! A command task's reports, counted, with the checkpoints they hand in persisted by the
//! agent: the N-th report of the task belongs to checkpoint index `base + N`
//! (`TRAINYARD_CHECKPOINT_BASE`), with a checkpoint or without, over every report
//! connection of the task. A checkpoint's files are copied into the run folder
//! (`TRAINYARD_RUN_DIR`) before the report goes on to the driver, with the
//! [`trainyard_checkpoint::HandIn`] that says whether they were; an `ASYNC` hand-in is taken
//! from the task first and persisted in the background ([`RankReports`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use trainyard_checkpoint::{RankReports, ReportSink};
use trainyard_runtime::events::EventSender;

/// The reports of a task started with `env`, sent to `events` in order.
pub(crate) fn task_reports(env: &BTreeMap<String, String>, events: EventSender) -> RankReports {
    let sink: ReportSink = Arc::new(move |metrics, hand_in| {
        let events = events.clone();
        Box::pin(async move { events.report_checkpoint(metrics, hand_in).await })
    });
    RankReports::new(env, sink)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use trainyard_checkpoint::RUN_DIR;
    use trainyard_runtime::TaskEvent;
    use trainyard_runtime::events::{ActorEvent, event_channel};

    use std::path::Path;

    use trainyard_checkpoint::{CHECKPOINT_BASE, HandIn, Reported, UploadMode};

    use super::*;

    const SYNC: UploadMode = UploadMode::Sync;

    fn metrics(step: u64) -> serde_json::Map<String, serde_json::Value> {
        let mut metrics = serde_json::Map::new();
        metrics.insert("step".into(), step.into());
        metrics
    }

    #[tokio::test]
    async fn reports_count_from_the_base_with_a_checkpoint_or_without() {
        let (events, mut stream) = event_channel(16);
        let env = BTreeMap::from([(CHECKPOINT_BASE.to_owned(), "7".to_owned())]);
        let reports = task_reports(&env, events);
        let again = reports.clone();
        assert_eq!(
            reports.report(metrics(1), None, SYNC, false).await,
            Reported {
                index: 8,
                error: None
            }
        );
        // No run folder: the checkpoint fails, and the index is taken all the same.
        let failed = again
            .report(metrics(2), Some(Path::new("/tmp")), SYNC, false)
            .await;
        assert_eq!(failed.index, 9);
        let error = failed.error.expect("no run folder to persist in");
        assert!(error.contains("TRAINYARD_RUN_DIR"), "{error}");
        assert_eq!(
            reports.report(metrics(3), None, SYNC, false).await.index,
            10
        );

        let first = stream.next().await;
        assert_eq!(
            first,
            Some(ActorEvent::Task {
                event: TaskEvent::Report {
                    metrics: metrics(1),
                    checkpoint: None
                },
                attempt: trainyard_runtime::AttemptNumber::default()
            })
        );
        let second = stream.next().await;
        assert_eq!(
            second,
            Some(ActorEvent::Task {
                event: TaskEvent::Report {
                    metrics: metrics(2),
                    checkpoint: Some(HandIn::Failed { index: 9, error })
                },
                attempt: trainyard_runtime::AttemptNumber::default()
            })
        );
    }

    #[tokio::test]
    async fn a_relative_checkpoint_directory_fails_without_touching_storage() {
        let (events, _stream) = event_channel(16);
        let env = BTreeMap::from([(RUN_DIR.to_owned(), "/nowhere/run".to_owned())]);
        let reports = task_reports(&env, events);
        let reported = reports
            .report(metrics(1), Some(Path::new("ckpt")), SYNC, false)
            .await;
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
