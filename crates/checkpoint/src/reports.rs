//! [`RankReports`]: one rank's reports, counted, with the checkpoints they hand in persisted,
//! passed on in the order they were made.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, oneshot, watch};

use crate::{CHECKPOINT_BASE, CheckpointWriter, HandIn, StorageError};

/// How many `ASYNC` hand-ins of one rank may be on their way at once (taken, not yet passed
/// on); the next `ASYNC` report waits for one of them.
pub const ASYNC_IN_FLIGHT: usize = 2;

/// How a report hands in its checkpoint (Ray Train's `CheckpointUploadMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UploadMode {
    /// The report returns once the files are persisted and the report passed on.
    #[default]
    Sync,
    /// The report returns once the files are taken from the rank (see
    /// [`CheckpointWriter::take`]); they are persisted in the background, and the report is
    /// passed on when they are. At most [`ASYNC_IN_FLIGHT`] at once per rank.
    Async,
    /// The files are in storage already, in a folder of the run folder the rank wrote them
    /// to: they are registered where they are ([`CheckpointWriter::register`]), not copied,
    /// and the report returns once it is passed on.
    NoUpload,
}

/// Where reports go, in order: the metrics, and what became of the checkpoint handed in
/// with them.
pub type ReportSink = Arc<
    dyn Fn(serde_json::Map<String, serde_json::Value>, Option<HandIn>) -> BoxFuture<'static, ()>
        + Send
        + Sync,
>;

/// What became of one report, when its caller is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The checkpoint index the report belongs to.
    pub index: u64,
    /// Why its checkpoint was not persisted (`SYNC`) or not taken (`ASYNC`), when it was not.
    pub error: Option<String>,
}

impl Reported {
    /// The index, or [`StorageError::HandInFailed`] with the reason.
    ///
    /// # Errors
    /// [`StorageError::HandInFailed`] when the checkpoint was not persisted (or taken).
    pub fn into_result(self) -> Result<u64, StorageError> {
        match self.error {
            None => Ok(self.index),
            Some(reason) => Err(StorageError::HandInFailed {
                index: self.index,
                reason,
            }),
        }
    }
}

/// The reports of one rank's task; cheap to clone, one count for every clone.
///
/// The N-th report belongs to checkpoint index `base + N` ([`CHECKPOINT_BASE`] of the task's
/// environment), with a checkpoint or without. Each report's hand-in runs on a task of its
/// own, so a caller that goes away does not leave a counted report unsent; reports reach the
/// sink in the order of their indices.
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::{Arc, Mutex};
/// use trainyard_checkpoint::{RankReports, ReportSink, UploadMode};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let into = Arc::clone(&seen);
/// let sink: ReportSink = Arc::new(move |metrics, _| {
///     into.lock().unwrap().push(metrics["step"].clone());
///     Box::pin(async {})
/// });
/// let env = BTreeMap::from([("TRAINYARD_CHECKPOINT_BASE".to_owned(), "4".to_owned())]);
/// let reports = RankReports::new(&env, sink);
/// let step = |n: u64| serde_json::json!({"step": n}).as_object().cloned().unwrap();
/// assert_eq!(reports.report(step(1), None, UploadMode::Async, false).await.index, 5);
/// assert_eq!(reports.report(step(2), None, UploadMode::Sync, false).await.index, 6);
/// assert!(reports.flush(std::time::Duration::from_secs(5)).await);
/// assert_eq!(*seen.lock().unwrap(), [1, 2]);
/// # }
/// ```
#[derive(Clone)]
pub struct RankReports {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RankReports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankReports")
            .field("base", &self.shared.base)
            .field("sent", &*self.shared.sent.borrow())
            .finish_non_exhaustive()
    }
}

struct Shared {
    /// The task's environment: the run folder and how to reach its storage.
    env: BTreeMap<String, String>,
    base: u64,
    sink: ReportSink,
    /// How many reports were made.
    count: Mutex<u64>,
    /// How many were passed on to the sink (always the first ones).
    sent: watch::Sender<u64>,
    /// The run folder, opened on the first checkpoint.
    writer: OnceLock<Result<Option<CheckpointWriter>, String>>,
    in_flight: Arc<Semaphore>,
    /// The runtime the reports' jobs run on: the first report's.
    runtime: OnceLock<tokio::runtime::Handle>,
    /// The jobs not known to have finished.
    jobs: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl RankReports {
    /// The reports of a task started with `env`, passed on to `sink`.
    #[must_use]
    pub fn new(env: &BTreeMap<String, String>, sink: ReportSink) -> Self {
        // A base that is not a number is none.
        let base = env
            .get(CHECKPOINT_BASE)
            .and_then(|b| b.trim().parse().ok())
            .unwrap_or(0);
        Self {
            shared: Arc::new(Shared {
                env: env.clone(),
                base,
                sink,
                count: Mutex::new(0),
                sent: watch::Sender::new(0),
                writer: OnceLock::new(),
                in_flight: Arc::new(Semaphore::new(ASYNC_IN_FLIGHT)),
                runtime: OnceLock::new(),
                jobs: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Counts a report, hands in `checkpoint` (an absolute directory; for `NO_UPLOAD`, a
    /// folder in the run folder, a path or a URI) as `mode` says, and passes the report on
    /// in its turn. Returns once the report is passed on (`SYNC`), or
    /// once the checkpoint is taken (`ASYNC`, after waiting for room among the hand-ins in
    /// flight; with `delete_local` the directory is gone then); a report without a
    /// checkpoint, once it is counted.
    pub async fn report(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<&Path>,
        mode: UploadMode,
        delete_local: bool,
    ) -> Reported {
        self.report_named(metrics, checkpoint, None, mode, delete_local)
            .await
    }

    /// [`RankReports::report`], with the files of a `SYNC` or `ASYNC` checkpoint copied into
    /// the folder `name` of the run folder when given (Ray Train's `checkpoint_dir_name`; see
    /// [`CheckpointWriter::persist_named`]) instead of the index's own. A `NO_UPLOAD`
    /// checkpoint stays where it is, whatever `name` says.
    pub async fn report_named(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<&Path>,
        name: Option<String>,
        mode: UploadMode,
        delete_local: bool,
    ) -> Reported {
        let permit = match (mode, checkpoint) {
            (UploadMode::Async, Some(_)) => Arc::clone(&self.shared.in_flight)
                .acquire_owned()
                .await
                .ok(),
            _ => None,
        };
        let runtime = self
            .shared
            .runtime
            .get_or_init(tokio::runtime::Handle::current);
        let Some(dir) = checkpoint.map(Path::to_path_buf) else {
            let shared = Arc::clone(&self.shared);
            let index = self.start(runtime, move |seq| {
                Box::pin(async move { shared.pass_on(seq, metrics, None).await })
            });
            return Reported { index, error: None };
        };
        let (taken_tx, taken) = oneshot::channel();
        let (sent_tx, sent) = oneshot::channel();
        let shared = Arc::clone(&self.shared);
        let base = self.shared.base;
        let index = self.start(runtime, move |seq| {
            Box::pin(async move {
                let index = base + seq;
                let hand_in = shared
                    .hand_in(index, &dir, name.as_deref(), mode, delete_local, taken_tx)
                    .await;
                let error = match &hand_in {
                    HandIn::Failed { error, .. } => Some(error.clone()),
                    HandIn::Persisted { .. } | HandIn::InStorage { .. } => None,
                };
                shared.pass_on(seq, metrics, Some(hand_in)).await;
                drop(permit);
                let _ = sent_tx.send(error);
            })
        });
        // A job aborted (its agent gave up on it) says nothing: that is no success.
        let abandoned = || Some("the hand-in was abandoned before it was persisted".to_owned());
        let error = match mode {
            UploadMode::Async => taken.await.unwrap_or_else(|_| abandoned()),
            UploadMode::Sync | UploadMode::NoUpload => sent.await.unwrap_or_else(|_| abandoned()),
        };
        Reported { index, error }
    }

    /// Counts a report without a checkpoint for callers that cannot wait: given to
    /// `send_now` at once when no report made before it is still on its way (the common
    /// case), else passed on in its turn by a job on the runtime of the earlier reports. Its
    /// index.
    pub fn report_now_or_later(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        send_now: impl FnOnce(serde_json::Map<String, serde_json::Value>),
    ) -> u64 {
        let runtime = self
            .shared
            .runtime
            .get()
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        let mut count = self.shared.lock_count();
        let seq = *count + 1;
        match runtime {
            Some(runtime) if *self.shared.sent.borrow() != *count => {
                *count = seq;
                let shared = Arc::clone(&self.shared);
                let job = runtime.spawn(async move { shared.pass_on(seq, metrics, None).await });
                self.shared.track(&job);
            }
            // Nothing before it is on its way (and with no runtime, nothing can be).
            _ => {
                *count = seq;
                send_now(metrics);
                self.shared
                    .sent
                    .send_modify(|sent| *sent = (*sent).max(seq));
            }
        }
        self.shared.base + seq
    }

    /// Counts a report and starts `job` with its number (1 for the task's first report),
    /// under the count's lock, so that numbers are handed out in the order jobs start; its
    /// index.
    fn start(
        &self,
        runtime: &tokio::runtime::Handle,
        job: impl FnOnce(u64) -> futures::future::BoxFuture<'static, ()>,
    ) -> u64 {
        let mut count = self.shared.lock_count();
        *count += 1;
        let seq = *count;
        let job = runtime.spawn(job(seq));
        self.shared.track(&job);
        self.shared.base + seq
    }

    /// Gives up on the reports not passed on yet: their jobs are aborted, their staging
    /// directories deleted, and they never reach the sink (after [`RankReports::flush`] ran
    /// out of time, so that none outlives its task).
    pub fn abandon(&self) {
        let jobs = std::mem::take(&mut *self.shared.lock_jobs());
        for job in jobs {
            job.abort();
        }
    }

    /// Waits up to `within` until every report made so far is passed on; whether they are.
    pub async fn flush(&self, within: Duration) -> bool {
        let made = *self.shared.lock_count();
        let mut sent = self.shared.sent.subscribe();
        tokio::time::timeout(within, sent.wait_for(|sent| *sent >= made))
            .await
            .is_ok_and(|waited| waited.is_ok())
    }

    /// How many reports were made and not passed on yet.
    #[must_use]
    pub fn unsent(&self) -> u64 {
        let made = *self.shared.lock_count();
        made.saturating_sub(*self.shared.sent.borrow())
    }
}

impl Shared {
    fn lock_count(&self) -> std::sync::MutexGuard<'_, u64> {
        self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_jobs(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::AbortHandle>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `job`'s handle for [`RankReports::abandon`], letting go of finished ones.
    fn track(&self, job: &tokio::task::JoinHandle<()>) {
        let mut jobs = self.lock_jobs();
        jobs.retain(|job| !job.is_finished());
        jobs.push(job.abort_handle());
    }

    /// Passes report `seq` on once every report before it is.
    async fn pass_on(
        &self,
        seq: u64,
        metrics: serde_json::Map<String, serde_json::Value>,
        hand_in: Option<HandIn>,
    ) {
        let mut turn = self.sent.subscribe();
        let _ = turn.wait_for(|sent| *sent + 1 >= seq).await;
        (self.sink)(metrics, hand_in).await;
        self.sent.send_modify(|sent| *sent = (*sent).max(seq));
    }

    /// The run folder's writer; an error in words when there is none.
    fn writer(&self) -> Result<&CheckpointWriter, String> {
        let opened = self.writer.get_or_init(|| {
            CheckpointWriter::from_env(&self.env)
                .map_err(|error| trainyard_config::resources::ErrorChain(&error).to_string())
        });
        match opened {
            Ok(Some(writer)) => Ok(writer),
            Ok(None) => {
                Err(trainyard_config::resources::ErrorChain(&StorageError::NoRunFolder).to_string())
            }
            Err(error) => Err(error.clone()),
        }
    }

    /// Persists the checkpoint of report `index`; `taken` is told once the rank may go on
    /// (`ASYNC`: the directory is taken, or why it is not), with the error.
    async fn hand_in(
        &self,
        index: u64,
        dir: &Path,
        name: Option<&str>,
        mode: UploadMode,
        delete_local: bool,
        taken: oneshot::Sender<Option<String>>,
    ) -> HandIn {
        let failed = |error: String| HandIn::Failed { index, error };
        let writer = if dir.is_absolute() || mode == UploadMode::NoUpload {
            self.writer()
        } else {
            Err(format!(
                "a checkpoint is handed in as an absolute directory; `{}` is not one",
                dir.display()
            ))
        };
        let writer = match writer {
            Ok(writer) => writer,
            Err(error) => {
                let _ = taken.send(Some(error.clone()));
                return failed(error);
            }
        };
        match mode {
            UploadMode::Sync => {
                let _ = taken.send(None);
                writer.hand_in(index, name, dir).await
            }
            UploadMode::NoUpload => {
                let _ = taken.send(None);
                let location = dir.to_string_lossy();
                match writer.register(index, &location).await {
                    Ok(hand_in) => hand_in,
                    Err(error) => {
                        failed(trainyard_config::resources::ErrorChain(&error).to_string())
                    }
                }
            }
            UploadMode::Async => match writer.take(dir, delete_local).await {
                Ok(staged) => {
                    let _ = taken.send(None);
                    let hand_in = writer.hand_in_taken(index, name, &staged).await;
                    staged.remove().await;
                    hand_in
                }
                Err(error) => {
                    let error = trainyard_config::resources::ErrorChain(&error).to_string();
                    let _ = taken.send(Some(error.clone()));
                    failed(error)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use tokio::sync::Semaphore as Gate;

    use super::*;
    use crate::RUN_DIR;

    fn step(n: u64) -> serde_json::Map<String, serde_json::Value> {
        let mut metrics = serde_json::Map::new();
        metrics.insert("step".into(), n.into());
        metrics
    }

    /// What reached a sink: each report's step and hand-in.
    type Seen = Arc<StdMutex<Vec<(u64, Option<HandIn>)>>>;

    /// A sink that records what reaches it, each report once `gate` lets it through.
    fn recording(gate: &Arc<Gate>) -> (ReportSink, Seen) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let (into, gate) = (Arc::clone(&seen), Arc::clone(gate));
        let sink: ReportSink = Arc::new(move |metrics, hand_in| {
            let (into, gate) = (Arc::clone(&into), Arc::clone(&gate));
            Box::pin(async move {
                gate.acquire().await.expect("open").forget();
                let n = metrics["step"].as_u64().expect("a step");
                into.lock().unwrap().push((n, hand_in));
            })
        });
        (sink, seen)
    }

    /// A temporary directory and a task environment whose run folder is in it.
    fn run_env() -> (tempfile::TempDir, BTreeMap<String, String>) {
        let root = tempfile::tempdir().unwrap();
        let env = BTreeMap::from([(
            RUN_DIR.to_owned(),
            root.path().join("run").display().to_string(),
        )]);
        (root, env)
    }

    fn shard(root: &Path, name: &str) -> std::path::PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.pt")), name).unwrap();
        dir
    }

    #[tokio::test]
    async fn async_hand_ins_return_when_taken_and_the_third_waits_for_room() {
        let (root, env) = run_env();
        let gate = Arc::new(Gate::new(0));
        let (sink, seen) = recording(&gate);
        let reports = RankReports::new(&env, sink);
        let mut dirs = Vec::new();
        for n in 1..=2 {
            let dir = shard(root.path(), &format!("c{n}"));
            let reported = reports
                .report(step(n), Some(&dir), UploadMode::Async, true)
                .await;
            assert_eq!(
                reported,
                Reported {
                    index: n,
                    error: None
                }
            );
            assert!(!dir.exists(), "taken: the directory is gone");
            dirs.push(dir);
        }
        // A report without a checkpoint does not wait for room, and goes after them.
        let metrics_only = reports
            .report(step(3), None, UploadMode::Async, false)
            .await;
        assert_eq!(metrics_only.index, 3);
        let third = shard(root.path(), "c4");
        let waiting = {
            let reports = reports.clone();
            let third = third.clone();
            tokio::spawn(async move {
                reports
                    .report(step(4), Some(&third), UploadMode::Async, false)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "two are in flight: the third waits");
        assert!(seen.lock().unwrap().is_empty());
        assert_eq!(reports.unsent(), 3);
        assert!(!reports.flush(Duration::from_millis(50)).await);
        gate.add_permits(1);
        let reported = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("room once the first is passed on")
            .unwrap();
        assert_eq!(reported.index, 4);
        assert!(third.join("c4.pt").is_file(), "kept: linked, not moved");
        gate.add_permits(10);
        assert!(reports.flush(Duration::from_secs(10)).await);
        let seen = seen.lock().unwrap();
        let order: Vec<u64> = seen.iter().map(|(n, _)| *n).collect();
        assert_eq!(order, [1, 2, 3, 4], "passed on in the order made");
        for (n, hand_in) in seen.iter() {
            match (n, hand_in) {
                (3, None) => {}
                (n, Some(HandIn::Persisted { index, files, .. })) => {
                    assert_eq!(index, n);
                    let name = format!("c{n}.pt");
                    assert_eq!(files, std::slice::from_ref(&name));
                    let dir = root
                        .path()
                        .join(format!("run/{}", crate::checkpoint_dir_name(*n)));
                    assert!(dir.join(name).is_file());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_directory_that_cannot_be_taken_is_refused_at_once_and_sent_as_failed() {
        let (root, env) = run_env();
        let gate = Arc::new(Gate::new(10));
        let (sink, seen) = recording(&gate);
        let reports = RankReports::new(&env, sink);
        let missing = root.path().join("missing");
        let reported = reports
            .report(step(1), Some(&missing), UploadMode::Async, true)
            .await;
        let error = reported.error.expect("refused");
        assert!(error.contains("missing"), "{error}");
        // The next one is not held up by it.
        let dir = shard(root.path(), "c2");
        let next = reports
            .report(step(2), Some(&dir), UploadMode::Sync, false)
            .await;
        assert_eq!(
            next,
            Reported {
                index: 2,
                error: None
            }
        );
        assert!(dir.exists(), "SYNC leaves the directory");
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0], (1, Some(HandIn::Failed { index: 1, error })));
        assert!(matches!(
            seen[1],
            (2, Some(HandIn::Persisted { index: 2, .. }))
        ));
    }

    #[tokio::test]
    async fn a_named_checkpoint_is_copied_into_that_folder_and_a_name_of_trainyards_refused() {
        let (root, env) = run_env();
        let gate = Arc::new(Gate::new(10));
        let (sink, seen) = recording(&gate);
        let reports = RankReports::new(&env, sink);
        let name = |n: &str| Some(n.to_owned());
        for (n, mode) in [(1, UploadMode::Sync), (2, UploadMode::Async)] {
            let dir = shard(root.path(), &format!("c{n}"));
            let reported = reports
                .report_named(
                    step(n),
                    Some(&dir),
                    name(&format!("iteration_{n}")),
                    mode,
                    false,
                )
                .await;
            assert_eq!(reported.error, None);
        }
        for bad in [
            "logs",
            "checkpoint_000009",
            "../elsewhere",
            "a/b",
            "/abs",
            "",
        ] {
            let dir = shard(root.path(), "bad");
            let reported = reports
                .report_named(step(9), Some(&dir), name(bad), UploadMode::Sync, false)
                .await;
            let error = reported.error.expect("refused");
            assert!(error.contains("checkpoint_dir_name"), "{bad}: {error}");
        }
        // The index's own name is no name.
        let dir = shard(root.path(), "c9");
        let own = crate::checkpoint_dir_name(9);
        reports
            .report_named(step(9), Some(&dir), Some(own), UploadMode::Sync, false)
            .await;
        assert!(reports.flush(Duration::from_secs(10)).await);
        let seen = seen.lock().unwrap();
        for n in [1, 2] {
            let folder = format!("iteration_{n}");
            match &seen[n as usize - 1] {
                (_, Some(HandIn::Persisted { dir, files, .. })) => {
                    assert_eq!(dir.as_deref(), Some(folder.as_str()));
                    assert_eq!(files, &[format!("c{n}.pt")]);
                }
                other => panic!("unexpected {other:?}"),
            }
            let file = root.path().join(format!("run/{folder}/c{n}.pt"));
            assert!(file.is_file(), "{}", file.display());
        }
        assert!(matches!(
            seen.last(),
            Some((_, Some(HandIn::Persisted { dir: None, .. })))
        ));
        assert!(!root.path().join("run/logs/bad.pt").exists());
    }

    #[tokio::test]
    async fn abandoned_reports_are_never_passed_on() {
        let (root, env) = run_env();
        let gate = Arc::new(Gate::new(0));
        let (sink, seen) = recording(&gate);
        let reports = RankReports::new(&env, sink);
        let dir = shard(root.path(), "c1");
        reports
            .report(step(1), Some(&dir), UploadMode::Async, true)
            .await;
        assert!(!reports.flush(Duration::from_millis(100)).await);
        reports.abandon();
        gate.add_permits(10);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(seen.lock().unwrap().is_empty(), "never passed on");
        assert_eq!(reports.unsent(), 1);
    }

    #[tokio::test]
    async fn a_report_sent_at_once_waits_behind_hand_ins_on_their_way() {
        let (root, env) = run_env();
        let gate = Arc::new(Gate::new(0));
        let (sink, seen) = recording(&gate);
        let reports = RankReports::new(&env, sink);
        let sent_now = |reports: &RankReports, n| {
            let seen = Arc::clone(&seen);
            let now = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let told = Arc::clone(&now);
            let index = reports.report_now_or_later(step(n), move |metrics| {
                let n = metrics["step"].as_u64().unwrap();
                seen.lock().unwrap().push((n, None));
                told.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            (index, now.load(std::sync::atomic::Ordering::SeqCst))
        };
        assert_eq!(sent_now(&reports, 1), (1, true));
        let dir = shard(root.path(), "c2");
        reports
            .report(step(2), Some(&dir), UploadMode::Async, true)
            .await;
        // Counted at once, passed on after the hand-in on its way.
        assert_eq!(sent_now(&reports, 3), (3, false));
        let last = reports.report(step(4), None, UploadMode::Sync, false).await;
        assert_eq!(last.index, 4);
        assert_eq!(reports.unsent(), 3);
        gate.add_permits(10);
        assert!(reports.flush(Duration::from_secs(10)).await);
        assert_eq!(sent_now(&reports, 5), (5, true));
        let order: Vec<u64> = seen.lock().unwrap().iter().map(|(n, _)| *n).collect();
        assert_eq!(order, [1, 2, 3, 4, 5]);
    }
}
