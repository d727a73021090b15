//! The run loop: the one place that owns the run's folder, its logs, the user's triggers and
//! the listener, receives what each [`Attempt`] does, and decides (cargo-nextest's
//! dispatcher is the model). What follows each attempt is the [`Policy`]'s call; the size of
//! each is the [`Sizer`]'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, info, info_span, warn};
use trainyard_checkpoint::RunStatus;
use trainyard_resources::Resources;
use trainyard_runtime::timings::{self as phase, TARGET as TIMINGS};
use trainyard_runtime::{DeathCause, NodeId, PlacementGroupId, RuntimeError, TaskExit, TaskSpec};

use crate::attempt::{Attempt, AttemptError, AttemptEvent, died, sleep_until};
use crate::crew::{Crew, keeps_crew};
use crate::elastic::{ResizeReason, Sizer};
use crate::hang::{StacksReason, full_dump};
use crate::logs::RankLogs;
use crate::options::RESTARTS_TARGET;
use crate::policy::{Action, History, Outcome, Policy, Progress};
use crate::ranks::rank_of;
use crate::report::{FitReport, RunEvent};
use crate::run_folder::{AttemptEnd, RunStore};
use crate::setup::Setup;
use crate::sink::Sink;
use crate::tally::Tally;
use crate::triggers::{StacksTrigger, StopTrigger};
use crate::{AttemptFailure, ExecutorError};

/// After a failure, how long the other ranks' streams must be silent before the attempt
/// stops taking in their lines and reports...
const QUIET: Duration = Duration::from_millis(20);
/// ... and how long it takes them in at most.
const LINGER: Duration = Duration::from_millis(200);
/// How long a resize waits for a checkpoint some ranks have handed in to commit before it
/// stops the attempt anyway (the run then restarts from the checkpoint before).
const CHECKPOINT_WAIT: Duration = Duration::from_secs(60);

/// What a run is driven with besides its setup.
#[derive(Debug)]
pub(crate) struct Controls {
    pub(crate) sink: Sink,
    pub(crate) stacks: StacksTrigger,
    pub(crate) stop: StopTrigger,
}

/// A run under way: its setup, folder, listener, triggers, sizes and policy.
#[derive(Debug)]
pub(crate) struct RunLoop {
    setup: Arc<Setup>,
    store: RunStore,
    controls: Controls,
    sizer: Sizer,
    policy: Policy,
}

/// What an attempt holds so far: released however the attempt ends.
#[derive(Debug, Default)]
enum Slot {
    /// Nothing reserved or running.
    #[default]
    Idle,
    /// The placement group is asked for or reserved; no worker exists.
    Reserved(PlacementGroupId),
    /// Workers exist (started fully, or part way).
    Started(Box<Attempt>),
}

/// How one attempt ended.
#[derive(Debug)]
enum End {
    /// Every rank's task succeeded.
    Done,
    /// The run cannot go on.
    Fatal(ExecutorError),
    /// The attempt failed.
    Failed(AttemptFailure),
    /// The stop trigger was pulled; the ranks' tasks are stopped (or being killed).
    Interrupted,
    /// Room for `to` workers appeared; the ranks' tasks are stopped (or being killed).
    Resize { to: u32 },
}

impl From<AttemptError> for End {
    fn from(error: AttemptError) -> Self {
        match error {
            AttemptError::Fatal(error) => Self::Fatal(error),
            AttemptError::Failed(failure) => Self::Failed(failure),
        }
    }
}

/// How a run that has a report ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Finished,
    Interrupted,
    Failed,
}

/// What wakes the run loop while an attempt's tasks run.
enum Woken {
    /// What the ranks did (`None`: every stream has ended).
    Event(Option<AttemptEvent>),
    /// Someone asked for the stacks.
    StacksWanted,
    /// Someone asked for the run to stop.
    StopWanted,
    /// Room for this many workers appeared (elastic runs).
    Grow(u32),
    /// A resize waited as long as it does for a checkpoint in flight.
    GrowAnyway,
}

/// What one attempt holds from its start to its release: its slot (placement group and
/// workers), what it reported, its log files and where they are uploaded.
#[derive(Debug)]
struct AttemptState {
    /// Restarts before this attempt.
    restart_count: u32,
    slot: Slot,
    report: FitReport,
    logs: Option<RankLogs>,
    /// Where in the run folder its logs go when it ends (remote storage).
    upload: Option<String>,
    /// How long its tasks ran before its end was decided (zero: they never started).
    trained: Duration,
}

impl AttemptState {
    fn new(restart_count: u32) -> Self {
        Self {
            restart_count,
            slot: Slot::Idle,
            report: FitReport::default(),
            logs: None,
            upload: None,
            trained: Duration::ZERO,
        }
    }

    /// What the attempt got done: a checkpoint its reports committed (the report's
    /// checkpoint is set only by a commit of this attempt's), and how long its tasks ran.
    fn progress(&self) -> Progress {
        Progress {
            committed: self.report.checkpoint.is_some(),
            trained: self.trained,
        }
    }
}

/// What the loop keeps of a running attempt besides the attempt itself.
struct Following<'a> {
    /// Restarts before this attempt.
    restart_count: u32,
    report: &'a mut FitReport,
    logs: &'a mut RankLogs,
    /// Set to how long the tasks ran once the attempt's end is decided.
    trained: &'a mut Duration,
    tally: Tally,
    /// Lines the listener had no room for, per rank, not yet reported as dropped.
    dropped: Vec<u64>,
}

impl RunLoop {
    /// Opens the run's folder before any worker starts (resuming the run of the same name
    /// when there is an unfinished one).
    pub(crate) async fn open(mut setup: Setup, controls: Controls) -> Result<Self, ExecutorError> {
        let store = RunStore::open(&setup.run, &setup.run_name, &setup.options.driver)
            .instrument(info_span!(target: TIMINGS, phase::RUN_FOLDER, attempt = 0))
            .await?;
        setup.run_name = store.name().to_owned();
        // The backends see the folder's name (`name-2` under `resume: never`).
        setup.run.name = Some(setup.run_name.clone());
        let sizer = Sizer::new(
            Arc::clone(&setup.runtime),
            setup.scaling.clone(),
            setup.options.health_check_timeout,
        );
        let policy = Policy {
            failures: setup.run.failure_config,
            backoff: setup.options.restart_backoff,
        };
        Ok(Self {
            setup: Arc::new(setup),
            store,
            controls,
            sizer,
            policy,
        })
    }

    /// Runs `task` to its end with the run's policy: a failed attempt shuts everything
    /// down, releases the placement group, waits out the backoff if the run is in a crash
    /// loop (see [`Policy`]) and starts again from scratch, with the restart count one higher.
    pub(crate) async fn run(mut self, task: &TaskSpec) -> Result<FitReport, ExecutorError> {
        self.controls
            .sink
            .emit(RunEvent::RunStarted {
                name: self.setup.run_name.clone(),
                run_dir: self.store.uri(),
                params: crate::params::of(&self.setup.scaling, &self.setup.run),
            })
            .await;
        let mut history = History::default();
        // The size the next attempt grows to, when the last one stopped to grow.
        let mut grow_to: Option<u32> = None;
        // The workers the last attempt left for the next (see `Crew`).
        let mut kept: Option<Crew> = None;
        let (mut report, ending) = loop {
            let restart_count = history.restarts();
            history.attempts += 1;
            let span = info_span!("attempt", run = %self.setup.run_name, restart_count);
            let mut state = AttemptState::new(restart_count);
            let end = self
                .attempt(task, &mut history, grow_to.take(), &mut state, kept.take())
                .instrument(span)
                .await;
            // Not a failure, a resize: the next attempt starts at once, from the latest
            // committed checkpoint. A stop and a run that cannot go on are not the
            // policy's to judge.
            let judged = match &end {
                End::Done => Some(Outcome::Succeeded),
                End::Resize { to } => Some(Outcome::RoomFor(*to)),
                End::Failed(failure) => Some(Outcome::Failed(failure.clone())),
                End::Fatal(_) | End::Interrupted => None,
            };
            let progressed = self.policy.made_progress(state.progress());
            let judged = judged.map(|outcome| {
                history.record(&outcome, progressed);
                let action = self.policy.next(&history, &outcome);
                (outcome, action)
            });
            let restarts = matches!(judged, Some((_, Action::Restart { .. })));
            let (report, crew) = self.release(state, &end, restarts).await;
            kept = crew;
            let (outcome, action) = match (end, judged) {
                (End::Fatal(error), _) => {
                    if history.attempts == 1 && history.resizes == 0 {
                        // Refused before anything trained: a folder this run made goes.
                        self.store.discard_if_new().await;
                    } else {
                        self.store.end_attempt(AttemptEnd::Ended).await;
                        self.store.finish(RunStatus::Failed).await;
                    }
                    return Err(error);
                }
                (End::Interrupted, _) => {
                    self.store.end_attempt(AttemptEnd::Ended).await;
                    break (report, Ending::Interrupted);
                }
                (_, Some(judged)) => judged,
                (_, None) => unreachable!("every other end is judged"),
            };
            self.store
                .end_attempt(match &outcome {
                    Outcome::Succeeded => AttemptEnd::Ended,
                    Outcome::RoomFor(to) => AttemptEnd::Resized(*to),
                    Outcome::Failed(failure) => AttemptEnd::Failed(failure),
                })
                .await;
            match action {
                Action::Finish => {
                    self.store.finish(RunStatus::Finished).await;
                    break (report, Ending::Finished);
                }
                Action::Fail => {
                    self.store.finish(RunStatus::Failed).await;
                    // What the final attempt reported before it failed stays in the report.
                    break (report, Ending::Failed);
                }
                Action::Resize { to } => grow_to = Some(to),
                Action::Restart { after } => {
                    if let Outcome::Failed(failure) = outcome {
                        let kept_workers = kept.as_ref().map_or(0, Crew::len);
                        warn!(target: RESTARTS_TARGET, %failure, restart_count, backoff_s = after.as_secs_f64(), kept_workers, "attempt failed; restarting");
                        self.controls
                            .sink
                            .emit(RunEvent::Restarting {
                                restart_count,
                                failure,
                                backoff_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
                            })
                            .await;
                    }
                    let stop = self.controls.stop.clone();
                    tokio::select! {
                        () = tokio::time::sleep(after) => {}
                        () = stop.requested() => break (report, Ending::Interrupted),
                    }
                }
            }
        };
        // Stopped while it waited to restart: the workers kept for the next attempt go.
        if let Some(crew) = kept.take() {
            crew.release(&self.setup, self.setup.options.shutdown_patience)
                .instrument(info_span!(target: TIMINGS, phase::SHUTDOWN))
                .await;
        }
        if ending == Ending::Interrupted {
            // Stopped on the driver's interruption: resumable, and not running any more.
            self.store.finish(RunStatus::Interrupted).await;
        }
        self.store.conclude(
            &mut report,
            history.attempts,
            history.failures,
            history.world_sizes,
            ending == Ending::Finished,
        );
        let report = Box::new(report);
        match ending {
            Ending::Finished => Ok(*report),
            Ending::Interrupted => Err(ExecutorError::Interrupted { report }),
            Ending::Failed => Err(ExecutorError::TrainingFailed { report }),
        }
    }

    /// Lets go of what an attempt that ended with `end` held (its log files, uploaded to
    /// remote storage; its workers and placement group, unless the run `restarts` and can keep
    /// them for the next attempt): what it reported, and the workers kept.
    async fn release(
        &mut self,
        state: AttemptState,
        end: &End,
        restarts: bool,
    ) -> (FitReport, Option<Crew>) {
        let AttemptState {
            mut report,
            logs,
            upload,
            slot,
            ..
        } = state;
        let kept = match slot {
            Slot::Started(mut attempt) if matches!(end, End::Failed(_)) && attempt.keepable() => {
                let lost = attempt.lost();
                let host_lost = attempt.lost_a_host();
                if keeps_crew(restarts, self.sizer.is_elastic(), lost, host_lost) {
                    attempt.settle(self.setup.options.stop_bound()).await;
                    Some(attempt.into_crew())
                } else {
                    self.release_slot(Slot::Started(attempt)).await;
                    None
                }
            }
            slot => {
                self.release_slot(slot).await;
                None
            }
        };
        report.run_dir = Some(self.store.uri());
        if let Some(logs) = logs {
            let dir = logs.dir().to_path_buf();
            report.log_dir = Some(dir.display().to_string());
            logs.close().await;
            if let Some(relative) = upload {
                self.store.upload_logs(&dir, &relative).await;
            }
        }
        (report, kept)
    }

    /// Lets go of the workers and the placement group the slot holds (the workers asked to
    /// stop within the shutdown patience; their tasks, if they were stopped, are gone), and
    /// tells the sizer what was freed.
    async fn release_slot(&mut self, slot: Slot) {
        let held = slot
            .release(&self.setup, self.setup.options.shutdown_patience)
            .await;
        self.sizer.released(held);
    }

    /// One attempt: sized (growing to `grow_to` when the last one stopped to grow), booked in
    /// the run's folder, started, and followed to its end. What it starts and opens is left
    /// in `state` for [`Self::release`].
    async fn attempt(
        &mut self,
        task: &TaskSpec,
        history: &mut History,
        grow_to: Option<u32>,
        state: &mut AttemptState,
        kept: Option<Crew>,
    ) -> End {
        let restart_count = state.restart_count;
        // The workers kept from the attempt before are this one's: released however it ends.
        let kept_size = kept.as_ref().map(Crew::len);
        if let Some(crew) = kept {
            state.slot = Slot::Started(Box::new(Attempt::again(&self.setup, crew, restart_count)));
        }
        let stop = self.controls.stop.clone();
        if stop.is_requested() {
            return End::Interrupted;
        }
        // A kept crew has its size; else the sizer says (an elastic run reads what is free).
        let mut world_size = match kept_size {
            Some(size) => u32::try_from(size).unwrap_or(u32::MAX),
            None if self.sizer.is_elastic() => {
                self.sizer
                    .next_world_size(grow_to)
                    .instrument(
                        info_span!(target: TIMINGS, phase::CLUSTER, attempt = restart_count),
                    )
                    .await
            }
            None => self.sizer.next_world_size(grow_to).await,
        };
        let previous = history.world_sizes.last().copied();
        history.world_sizes.push(world_size);
        let opened = self
            .open_attempt(world_size, restart_count)
            .instrument(info_span!(target: TIMINGS, phase::RUN_FOLDER, attempt = restart_count))
            .await;
        let (checkpoint_env, opened_logs, remote) = match opened {
            Ok(opened) => opened,
            Err(error) => return End::Fatal(error),
        };
        state.upload = remote;
        let AttemptState {
            slot,
            report,
            logs,
            trained,
            ..
        } = state;
        let logs = logs.insert(opened_logs);
        // Until the tasks run, a stop drops the start; from then on the attempt stops its
        // tasks itself, streaming what they print as they stop.
        tokio::select! {
            biased;
            () = stop.requested() => return End::Interrupted,
            started = self.start(slot, &mut world_size, previous, restart_count) => {
                if let Err(error) = started {
                    return error.into();
                }
            }
        }
        // Fewer workers than chosen may have fit by the time the group was reserved.
        if history.world_sizes.last() != Some(&world_size) {
            history.world_sizes.pop();
            history.world_sizes.push(world_size);
            if let Err(error) = self.store.resize_attempt(world_size).await {
                return End::Fatal(ExecutorError::Storage(error));
            }
        }
        let Slot::Started(attempt) = slot else {
            unreachable!("a successful start leaves a started attempt");
        };
        let (pids, started) = attempt.start_task(task, &checkpoint_env).await;
        for (i, pid) in pids.iter().enumerate() {
            let event = RunEvent::TaskStarted {
                rank: rank_of(i),
                pid: *pid,
            };
            self.controls.sink.emit(event).await;
        }
        if let Err(error) = started {
            return error.into();
        }
        info!("{}", attempt.describe(&pids));
        self.store.record_workers(&attempt.workers(), &pids).await;
        let following = Following {
            restart_count,
            tally: Tally::new(pids.len()),
            dropped: vec![0; pids.len()],
            report,
            logs,
            trained,
        };
        self.follow(attempt, following).await
    }

    /// Books the attempt in the run's folder and opens its log files: the environment every
    /// rank's task gets about checkpoints, the logs, and where they are uploaded to.
    async fn open_attempt(
        &mut self,
        world_size: u32,
        restart_count: u32,
    ) -> Result<
        (
            std::collections::BTreeMap<String, String>,
            RankLogs,
            Option<String>,
        ),
        ExecutorError,
    > {
        let begun = self
            .store
            .begin_attempt(world_size, restart_count, self.setup.run.log_dir.as_deref())
            .await
            .map_err(ExecutorError::Storage)?;
        let sink = &self.controls.sink;
        if let Some(checkpoint) = begun.resumed {
            info!(run = %self.setup.run_name, path = %checkpoint.path, "every rank starts from the latest committed checkpoint");
            sink.emit(RunEvent::Resuming {
                restart_count,
                checkpoint,
            })
            .await;
        }
        let most = self.setup.scaling.num_workers.max() as usize;
        let logs = RankLogs::open(begun.logs, most);
        sink.emit(RunEvent::LogFiles {
            restart_count,
            dir: logs.dir().display().to_string(),
        })
        .await;
        Ok((begun.env, logs, begun.upload_logs_to))
    }

    /// Starts one attempt: reserves the placement group, starts and sorts the workers,
    /// assigns ranks, shares accelerator ids, runs the backend's `on_start` and the preflight.
    /// On the crew kept from the attempt before (already in `slot`), replaces its lost workers
    /// instead of reserving and starting; the preflight runs on a kept crew too. A kept crew
    /// whose lost workers cannot be replaced (their host is gone, say) is let go, and the
    /// attempt starts afresh on a new group: a slower start, not another failure.
    async fn start(
        &self,
        slot: &mut Slot,
        world_size: &mut u32,
        previous: Option<u32>,
        restart_count: u32,
    ) -> Result<(), AttemptError> {
        if let Slot::Started(attempt) = slot
            && attempt.kept()
        {
            let replaced = attempt
                .start_workers()
                .instrument(info_span!(target: TIMINGS, phase::AGENTS, attempt = restart_count))
                .await;
            if let Err(error) = replaced {
                // Not a failure of the run's: the attempt starts afresh, on a new group.
                warn!(
                    ?error,
                    "the workers that were lost could not be replaced beside the kept ones: starting every worker afresh"
                );
                std::mem::take(slot)
                    .release(&self.setup, self.setup.options.shutdown_patience)
                    .await;
            }
        }
        if !matches!(slot, Slot::Started(_)) {
            let (pg, held) = self
                .reserve(slot, world_size, previous, restart_count)
                .instrument(info_span!(target: TIMINGS, phase::RESERVE, attempt = restart_count))
                .await?;
            // Held from here on, so that the release frees whatever part of the start
            // happened, whichever step fails or times out.
            *slot = Slot::Started(Box::new(Attempt::new(
                &self.setup,
                pg,
                held,
                *world_size,
                restart_count,
            )?));
            let Slot::Started(attempt) = slot else {
                unreachable!("the slot holds the attempt's workers");
            };
            attempt
                .start_workers()
                .instrument(info_span!(target: TIMINGS, phase::AGENTS, attempt = restart_count))
                .await?;
        }
        let Slot::Started(attempt) = slot else {
            unreachable!("the slot holds the attempt's workers");
        };
        async {
            attempt.prepare_environment().await?;
            let workers = attempt.workers();
            self.controls
                .sink
                .emit(RunEvent::AttemptStarted {
                    restart_count,
                    world_size: u32::try_from(workers.len()).unwrap_or(u32::MAX),
                    workers,
                })
                .await;
            attempt.preflight().await
        }
        .instrument(info_span!(target: TIMINGS, phase::SETUP, attempt = restart_count))
        .await
    }

    /// Asks for the placement group of `world_size` workers and waits until it is reserved;
    /// each bundle with the node it is reserved on. An elastic run cuts `world_size` down
    /// as it waits when fewer workers fit.
    async fn reserve(
        &self,
        slot: &mut Slot,
        world_size: &mut u32,
        previous: Option<u32>,
        restart_count: u32,
    ) -> Result<(PlacementGroupId, Vec<(NodeId, Resources)>), AttemptError> {
        let setup = &self.setup;
        let sink = &self.controls.sink;
        let deadline = Instant::now() + setup.options.placement_timeout;
        'size: loop {
            let factory = setup
                .scaling
                .placement_group_factory_for(*world_size)
                .map_err(ExecutorError::from)?;
            let requested = factory.total_resources().map_err(ExecutorError::from)?;
            sink.emit(RunEvent::Placing {
                restart_count,
                bundles: factory.bundles.len(),
                requested: requested.clone(),
            })
            .await;
            let limit = setup.options.health_check_timeout;
            let pg = tokio::time::timeout(limit, setup.runtime.create_placement_group(&factory))
                .await
                .map_err(|_| ExecutorError::Timeout {
                    operation: "creating the placement group",
                    after: limit,
                })?
                .map_err(|e| match e {
                    RuntimeError::Infeasible(_) | RuntimeError::Refused { .. } => {
                        ExecutorError::Unschedulable(Box::new(e))
                    }
                    other => ExecutorError::Runtime(Box::new(other)),
                })?;
            *slot = Slot::Reserved(pg);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let slice = self.sizer.wait_slice(*world_size, left);
                match setup.runtime.wait_placement_group_ready(pg, slice).await {
                    Ok(placed) => {
                        if let Some(from) = previous {
                            self.resized(from, *world_size, restart_count).await;
                        }
                        sink.emit(RunEvent::Placed {
                            bundle_nodes: placed
                                .bundle_nodes
                                .iter()
                                .map(ToString::to_string)
                                .collect(),
                        })
                        .await;
                        let held = placed.bundle_nodes.into_iter().zip(factory.bundles);
                        return Ok((pg, held.collect()));
                    }
                    Err(RuntimeError::PlacementTimeout { .. }) if slice < left => {
                        match self.sizer.workers_fitting(&[]).await {
                            Some(n) if n < *world_size => {
                                info!(run = %setup.run_name, waiting_for = *world_size, fit = n, "fewer workers fit than the attempt waits for; it starts with those");
                                slot.remove_group(setup).await;
                                *world_size = n;
                                continue 'size;
                            }
                            _ => {}
                        }
                    }
                    Err(RuntimeError::PlacementTimeout { .. }) => {
                        let available = self.free_resources().await;
                        slot.remove_group(setup).await;
                        return Err(ExecutorError::PlacementTimeout {
                            waited: setup.options.placement_timeout,
                            requested,
                            available,
                        }
                        .into());
                    }
                    Err(e @ (RuntimeError::Busy(_) | RuntimeError::Refused { .. })) => {
                        slot.remove_group(setup).await;
                        return Err(ExecutorError::Unschedulable(Box::new(e)).into());
                    }
                    Err(e) => return Err(ExecutorError::Runtime(Box::new(e)).into()),
                }
            }
        }
    }

    /// What the cluster has free, for an explanation; empty when it cannot be read.
    async fn free_resources(&self) -> Resources {
        let limit = self.setup.options.health_check_timeout;
        match tokio::time::timeout(limit, self.setup.runtime.cluster()).await {
            Ok(Ok(cluster)) => cluster.available(),
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the cluster's free resources");
                Resources::new()
            }
            Err(_) => {
                warn!("reading the cluster's free resources timed out");
                Resources::new()
            }
        }
    }

    /// Says that the run changed size from `from` workers to `to`, if it did.
    async fn resized(&self, from: u32, to: u32, restart_count: u32) {
        if from == to {
            return;
        }
        let reason = if to > from {
            ResizeReason::RoomAppeared
        } else {
            ResizeReason::WorkersLost
        };
        info!(target: RESTARTS_TARGET, run = %self.setup.run_name, from, to, %reason, "the run resizes");
        self.controls
            .sink
            .emit(RunEvent::Resized {
                restart_count,
                from,
                to,
                reason,
            })
            .await;
    }

    /// Follows the attempt's events until all tasks succeed, one fails or hangs, the run is
    /// asked to stop, or an elastic run finds room to grow. After a failure, what the other
    /// ranks printed or reported just before is still taken in, until their streams fall
    /// quiet for [`QUIET`] (at most [`LINGER`]); after a stop, until the stopped tasks'
    /// streams end.
    async fn follow(&mut self, attempt: &mut Attempt, mut following: Following<'_>) -> End {
        let started = Instant::now();
        let n = following.dropped.len();
        following.report.metrics = vec![None; n];
        let stop = self.controls.stop.clone();
        let stacks = self.controls.stacks.clone();
        // An elastic run below its maximum looks for room to grow while it trains.
        let sizer = self.sizer.clone();
        let held = attempt.held().to_vec();
        let room = async move {
            if sizer.can_grow(n) {
                sizer
                    .room_to_grow(&held, u32::try_from(n).unwrap_or(u32::MAX))
                    .await
            } else {
                std::future::pending().await
            }
        };
        tokio::pin!(room);
        // Room found while a checkpoint was in flight: the size, and how long to wait for
        // the checkpoint.
        let mut grow: Option<(u32, Instant)> = None;
        let end = loop {
            let woken = tokio::select! {
                biased;
                event = attempt.next() => Woken::Event(event),
                () = stacks.requested() => Woken::StacksWanted,
                () = stop.requested() => Woken::StopWanted,
                to = &mut room, if grow.is_none() => Woken::Grow(to),
                () = sleep_until(grow.map(|(_, until)| until)) => Woken::GrowAnyway,
            };
            if let Some(end) = self
                .take_woken(woken, attempt, &mut following, &mut grow)
                .await
            {
                break end;
            }
        };
        *following.trained = started.elapsed();
        match end {
            End::Interrupted | End::Resize { .. } => {
                self.stop_and_drain(attempt, &mut following, false).await;
            }
            End::Done => {}
            _ => {
                self.linger(attempt, &mut following).await;
                self.keep_checkpoint(attempt, &mut following).await;
                // The ranks still running are stopped (their workers stay, for a restart),
                // and what they print as they stop is streamed.
                if attempt.tasks_running() {
                    self.stop_and_drain(attempt, &mut following, false).await;
                }
            }
        }
        let Following {
            report,
            tally,
            dropped,
            ..
        } = following;
        // Of the ranks that failed, the first by the time its task ended.
        let end = match (end, tally.first_failure()) {
            (End::Failed(AttemptFailure::TaskFailed { .. }), Some(first)) => End::Failed(first),
            (end, _) => end,
        };
        // Drops not reported yet are reported now, waiting for room.
        for (i, count) in dropped.into_iter().enumerate() {
            if count > 0 {
                report.dropped_lines += count;
                self.controls
                    .sink
                    .emit(RunEvent::LogsDropped {
                        rank: rank_of(i),
                        count,
                    })
                    .await;
            }
        }
        end
    }

    /// Takes in what woke the loop following `attempt`: how the attempt ends, if it does.
    /// `grow` is room found while a checkpoint was in flight (the size, and until when the
    /// resize waits for the checkpoint).
    async fn take_woken(
        &mut self,
        woken: Woken,
        attempt: &mut Attempt,
        following: &mut Following<'_>,
        grow: &mut Option<(u32, Instant)>,
    ) -> Option<End> {
        let event = match woken {
            Woken::Event(Some(event)) => event,
            // Every stream ends with its marker, and the marker of a rank that has not
            // finished ends the attempt, so the merged stream never runs dry first.
            Woken::Event(None) => {
                return Some(End::Failed(AttemptFailure::WorkerDied {
                    rank: None,
                    cause: DeathCause::ConnectionLost,
                }));
            }
            Woken::StacksWanted => {
                self.show_stacks(attempt, StacksReason::Requested, following.logs)
                    .await;
                return None;
            }
            Woken::StopWanted => return Some(End::Interrupted),
            Woken::Grow(to) => {
                if self.store.checkpoint_in_flight() {
                    info!(
                        to,
                        "room for more workers; the resize waits for the checkpoint in flight to commit"
                    );
                    *grow = Some((to, Instant::now() + CHECKPOINT_WAIT));
                    return None;
                }
                return Some(End::Resize { to });
            }
            Woken::GrowAnyway => {
                let to = grow.map_or(0, |(to, _)| to);
                warn!(
                    to,
                    wait_s = CHECKPOINT_WAIT.as_secs(),
                    "the checkpoint in flight did not commit in time; resizing from the one before"
                );
                return Some(End::Resize { to });
            }
        };
        match event {
            AttemptEvent::Hung { ranks, idle } => {
                let file = self
                    .show_stacks(attempt, StacksReason::Hung, following.logs)
                    .await;
                Some(End::Failed(AttemptFailure::Hung {
                    ranks: ranks.into_iter().map(rank_of).collect(),
                    idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
                    stacks_file: file,
                }))
            }
            AttemptEvent::Exited {
                rank,
                exit: TaskExit::Succeeded { value },
            } => following.tally.returned(rank, value).then(|| {
                following.report.returns = following.tally.returns();
                End::Done
            }),
            AttemptEvent::Exited {
                rank,
                exit: TaskExit::Failed { failure },
            } => Some(End::Failed(following.tally.failed(rank, failure))),
            AttemptEvent::Died { rank, cause } => Some(End::Failed(died(rank, cause))),
            event => {
                if let Err(failure) = self.take(event, following).await {
                    return Some(End::Failed(failure));
                }
                grow.filter(|_| !self.store.checkpoint_in_flight())
                    .map(|(to, _)| End::Resize { to })
            }
        }
    }

    /// After a failure: takes in what the other ranks print, report and fail with until
    /// their streams are quiet for [`QUIET`], at most [`LINGER`].
    async fn linger(&mut self, attempt: &mut Attempt, following: &mut Following<'_>) {
        let deadline = Instant::now() + LINGER;
        loop {
            let quiet = (Instant::now() + QUIET).min(deadline);
            let Ok(Some(next)) = tokio::time::timeout_at(quiet, attempt.next_settling()).await
            else {
                break;
            };
            match next {
                Some(AttemptEvent::Exited {
                    rank,
                    exit: TaskExit::Failed { failure },
                }) => {
                    following.tally.failed(rank, failure);
                }
                // A checkpoint every rank reported before the failure still commits.
                Some(event) => self.take_settling(event, following).await,
                None => {}
            }
            if Instant::now() >= deadline {
                break;
            }
        }
    }

    /// After a failure, when the ranks that ended all handed in a checkpoint whose other
    /// parts may still be on their way (`ASYNC`: taken from the surviving ranks, and being
    /// persisted by their agents), keeps it: the other ranks are stopped, and their reports,
    /// which their agents send once the parts are persisted, are waited for (at most
    /// [`CHECKPOINT_WAIT`]). Without this, the next attempt would resume from the checkpoint
    /// before.
    async fn keep_checkpoint(&mut self, attempt: &mut Attempt, following: &mut Following<'_>) {
        let Some(index) = self.store.checkpoint_completable(&attempt.tasks_finished()) else {
            return;
        };
        info!(
            index,
            wait_s = CHECKPOINT_WAIT.as_secs(),
            "stopping the ranks still running; checkpoint {index}, which every rank that ended handed in, commits if their parts of it are persisted within {} s",
            CHECKPOINT_WAIT.as_secs()
        );
        self.stop_and_drain(attempt, following, true).await;
        let committed = self
            .store
            .latest()
            .is_some_and(|latest| latest.index >= index);
        if !committed && !self.controls.stop.is_requested() {
            warn!(
                index,
                "checkpoint {index} did not commit: a rank stopped without handing in its part of it, or the parts were not persisted within {} s",
                CHECKPOINT_WAIT.as_secs()
            );
        }
    }

    /// After a stop request: asks every worker whose task goes on to stop it, and meanwhile
    /// takes in what the ranks print and report as they stop, until every rank's task has
    /// ended. Bounded by the shutdown patience and a few seconds, or, with
    /// `for_checkpoint`, by [`CHECKPOINT_WAIT`] while a checkpoint every rank that ended
    /// handed in can still commit (or until the run is asked to stop); what is left then is
    /// killed as the attempt is released.
    async fn stop_and_drain(
        &mut self,
        attempt: &mut Attempt,
        following: &mut Following<'_>,
        mut for_checkpoint: bool,
    ) {
        let bound = self.setup.options.stop_bound();
        let started = Instant::now();
        let interrupt = self.controls.stop.clone();
        // A task stopped while its part of a checkpoint persists answers once it is: its
        // worker is killed only past the longest the drain may wait for the checkpoint.
        let patience = if for_checkpoint {
            bound.max(CHECKPOINT_WAIT)
        } else {
            bound
        };
        let stops = attempt.stop_tasks(patience);
        tokio::pin!(stops);
        let mut stopped = false;
        while attempt.tasks_running() {
            let waiting = for_checkpoint
                && self
                    .store
                    .checkpoint_completable(&attempt.tasks_finished())
                    .is_some();
            let deadline = started
                + if waiting {
                    bound.max(CHECKPOINT_WAIT)
                } else {
                    bound
                };
            let next = tokio::select! {
                () = &mut stops, if !stopped => {
                    stopped = true;
                    continue;
                }
                // Waiting for a checkpoint is no reason to keep a run asked to stop: the
                // ranks are drained as after any stop request.
                () = interrupt.requested(), if for_checkpoint => {
                    for_checkpoint = false;
                    continue;
                }
                next = tokio::time::timeout_at(deadline, attempt.next_settling()) => next,
            };
            let Ok(Some(next)) = next else {
                break;
            };
            // A checkpoint every rank reported before the stop still commits; exits and
            // deaths are what the stop is for.
            if let Some(event) = next {
                self.take_settling(event, following).await;
            }
        }
    }

    /// Takes in what a rank reported or printed after the attempt's end was decided: a
    /// report that cannot be booked changes nothing any more.
    async fn take_settling(&mut self, event: AttemptEvent, following: &mut Following<'_>) {
        let _ = self.take(event, following).await;
    }

    /// Takes in one report, line or root cause of a rank: recorded, booked towards a
    /// checkpoint, written to the rank's log file, and passed to the listener. A report
    /// that cannot be booked fails the attempt.
    async fn take(
        &mut self,
        event: AttemptEvent,
        following: &mut Following<'_>,
    ) -> Result<(), AttemptFailure> {
        let sink = &self.controls.sink;
        let report = &mut *following.report;
        match event {
            AttemptEvent::Report {
                rank: i,
                metrics,
                checkpoint,
            } => {
                let rank = rank_of(i);
                report.metrics[i] = Some(metrics.clone());
                report.last_report = Some((rank, metrics.clone()));
                let step = self.store.next_step(rank.0);
                let handed_in = checkpoint.is_some();
                let committed = self.store.report(rank.0, &metrics, checkpoint).await?;
                sink.emit(RunEvent::Report {
                    rank,
                    metrics,
                    step,
                    attempt: following.restart_count,
                    time: trainyard_checkpoint::now(),
                    checkpoint: handed_in,
                })
                .await;
                if let Some(checkpoint) = committed {
                    report.checkpoint = Some(checkpoint.clone());
                    sink.emit(RunEvent::CheckpointCommitted { checkpoint })
                        .await;
                }
            }
            AttemptEvent::Line {
                rank: i,
                pid,
                stream,
                line,
            } => {
                let rank = rank_of(i);
                following.logs.line(i, stream, &line);
                following.tally.line(i, &line);
                let line = RunEvent::Log {
                    rank,
                    pid,
                    stream,
                    line,
                };
                // The count of earlier drops goes first, and while it finds no room the line
                // is dropped too, so that the order stays true.
                let dropped = &mut following.dropped[i];
                if *dropped > 0
                    && sink.emit_line(RunEvent::LogsDropped {
                        rank,
                        count: *dropped,
                    })
                {
                    report.dropped_lines += *dropped;
                    *dropped = 0;
                }
                if *dropped > 0 || !sink.emit_line(line) {
                    *dropped += 1;
                }
            }
            AttemptEvent::LinesDropped { rank, count } => {
                report.dropped_lines += count;
                sink.emit(RunEvent::LogsDropped {
                    rank: rank_of(rank),
                    count,
                })
                .await;
            }
            AttemptEvent::RootCause {
                rank,
                ended_ms,
                error,
            } => following.tally.root_cause(rank, ended_ms, error),
            // Ends of tasks and workers are the caller's to judge.
            AttemptEvent::Exited { .. } | AttemptEvent::Died { .. } | AttemptEvent::Hung { .. } => {
            }
        }
        Ok(())
    }

    /// Captures every rank's stacks, writes them in full beside the rank logs, and streams
    /// them; the dump file's path.
    async fn show_stacks(
        &self,
        attempt: &Attempt,
        reason: StacksReason,
        logs: &mut RankLogs,
    ) -> Option<String> {
        let ranks = attempt.stacks().await;
        let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', "");
        let name = format!("stacks-{at}.txt");
        let file = logs.file(&name, full_dump(&ranks)).display().to_string();
        tracing::debug!(
            ?reason,
            ranks = ranks.len(),
            file,
            "captured every rank's stacks"
        );
        self.controls
            .sink
            .emit(RunEvent::Stacks {
                reason,
                ranks,
                file: Some(file.clone()),
            })
            .await;
        Some(file)
    }
}

impl Slot {
    /// Removes the reserved placement group, if that is what the slot holds.
    async fn remove_group(&mut self, setup: &Setup) {
        if let Self::Reserved(pg) = std::mem::take(self) {
            setup.remove_placement_group(pg).await;
        }
    }

    /// Releases whatever the slot holds, giving the workers `patience` to stop; what the
    /// attempt held (each bundle and its node).
    async fn release(self, setup: &Setup, patience: Duration) -> Vec<(NodeId, Resources)> {
        match self {
            Self::Started(attempt) => {
                let held = attempt.held().to_vec();
                let span =
                    info_span!(target: TIMINGS, phase::SHUTDOWN, attempt = attempt.restart_count());
                attempt.release(patience).instrument(span).await;
                held
            }
            Self::Reserved(pg) => {
                let span = info_span!(target: TIMINGS, phase::SHUTDOWN);
                setup.remove_placement_group(pg).instrument(span).await;
                Vec::new()
            }
            Self::Idle => {
                let _span = info_span!(target: TIMINGS, phase::SHUTDOWN).entered();
                Vec::new()
            }
        }
    }
}
