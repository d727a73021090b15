//! [`CheckpointBook`]: which index is committed when, sans IO.

use std::collections::{BTreeMap, HashMap};

use crate::{BookError, HandIn};

/// A checkpoint index that every rank has reported, with every rank's files persisted.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// The index.
    pub index: u64,
    /// World rank 0's metrics of that report.
    pub metrics: serde_json::Map<String, serde_json::Value>,
    /// Every rank's files, relative to the checkpoint folder, sorted.
    pub files: Vec<String>,
    /// Their total size in bytes.
    pub bytes: u64,
    /// The folder the ranks registered it in (a `NO_UPLOAD` report) or had it copied to (a
    /// report's `checkpoint_dir_name`), relative to the run folder, or `None` for the index's
    /// own folder (`checkpoint_000003`).
    pub dir: Option<String>,
    /// Whether some rank's files were copied (a `SYNC` or `ASYNC` hand-in, not `NO_UPLOAD`):
    /// staged by a writer of the attempt, they are to be moved into the folder
    /// ([`crate::RunFolder::commit_staged`]) before the commit is recorded.
    pub staged: bool,
}

/// One index that not every rank has reported yet.
#[derive(Debug, Default)]
struct Pending {
    reported: Vec<bool>,
    rank0_metrics: Option<serde_json::Map<String, serde_json::Value>>,
    /// file name → the rank that handed it in.
    files: BTreeMap<String, u32>,
    bytes: u64,
    /// Where the first rank's files are: `Some(None)` for the index's own folder,
    /// `Some(Some(dir))` for a folder registered in storage.
    dir: Option<Option<String>>,
    handed_in: bool,
    /// Whether some rank's files were copied rather than registered where they are.
    staged: bool,
    failed: bool,
}

/// The driver's book of one attempt's reports: the N-th report of every rank belongs to
/// index `base + N`; an index is committed when every rank has reported it, at least one
/// rank handed in files with it, no rank's files failed to persist, and every rank that
/// handed in files put them in the same folder (the index's own, one a report named, or one
/// registered in storage with `NO_UPLOAD`: ranks may mix the two).
///
/// ```
/// use trainyard_checkpoint::{CheckpointBook, HandIn};
///
/// let mut book = CheckpointBook::new(2, 3); // two ranks, resumed from checkpoint 3
/// let files = |name: &str| Some(HandIn::Persisted { index: 4, dir: None, files: vec![name.into()], bytes: 10 });
/// assert_eq!(book.record(1, Default::default(), files("shard_1"))?, None);
/// let commit = book.record(0, Default::default(), files("shard_0"))?.expect("both ranks reported");
/// assert_eq!((commit.index, commit.files), (4, vec!["shard_0".to_owned(), "shard_1".to_owned()]));
/// # Ok::<(), trainyard_checkpoint::BookError>(())
/// ```
#[derive(Debug)]
pub struct CheckpointBook {
    world_size: u32,
    base: u64,
    /// How many reports each rank has made.
    counts: Vec<u64>,
    pending: HashMap<u64, Pending>,
}

impl CheckpointBook {
    /// A book for `world_size` ranks whose first report is index `base + 1`.
    #[must_use]
    pub fn new(world_size: u32, base: u64) -> Self {
        Self {
            world_size,
            base,
            counts: vec![0; world_size as usize],
            pending: HashMap::new(),
        }
    }

    /// The index the next report of `rank` belongs to.
    #[must_use]
    pub fn next_index(&self, rank: u32) -> u64 {
        self.base + self.counts.get(rank as usize).copied().unwrap_or(0) + 1
    }

    /// The highest index any rank has reported.
    #[must_use]
    pub fn highest_index(&self) -> u64 {
        self.base + self.counts.iter().copied().max().unwrap_or(0)
    }

    /// Whether a checkpoint is on its way: some rank handed in files for an index that not
    /// every rank has reported yet (and none failed to persist).
    #[must_use]
    pub fn in_flight(&self) -> bool {
        self.pending.values().any(|p| p.handed_in && !p.failed)
    }

    /// The lowest index in flight that can still commit once the ranks still running report
    /// it: every rank that `ended` (by world rank) reported it, and some rank handed in
    /// files with it, none failing. After a rank's failure, the survivors' parts of such a
    /// checkpoint may still be on their way (`ASYNC`): stopping them and waiting for their
    /// reports keeps the checkpoint.
    #[must_use]
    pub fn completable(&self, ended: &[bool]) -> Option<u64> {
        self.pending
            .iter()
            .filter(|(_, p)| p.handed_in && !p.failed)
            .filter(|(_, p)| {
                ended
                    .iter()
                    .zip(&p.reported)
                    .all(|(ended, reported)| !ended || *reported)
            })
            .map(|(index, _)| *index)
            .min()
    }

    /// Books the next report of `rank`; the commit it completes, if any.
    ///
    /// # Errors
    /// [`BookError::UnknownRank`]. Files of the same name from several ranks are one file of
    /// the checkpoint (the folder holds the copy persisted last).
    pub fn record(
        &mut self,
        rank: u32,
        metrics: serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<HandIn>,
    ) -> Result<Option<Commit>, BookError> {
        let world_size = self.world_size;
        let Some(count) = self.counts.get_mut(rank as usize) else {
            return Err(BookError::UnknownRank { rank, world_size });
        };
        *count += 1;
        let index = self.base + *count;
        let pending = self.pending.entry(index).or_insert_with(|| Pending {
            reported: vec![false; world_size as usize],
            ..Pending::default()
        });
        pending.reported[rank as usize] = true;
        if rank == 0 {
            pending.rank0_metrics = Some(metrics);
        }
        match checkpoint {
            None => {}
            Some(HandIn::Failed { .. }) => pending.failed = true,
            Some(HandIn::InStorage {
                dir, files, bytes, ..
            }) => {
                pending.handed_in = true;
                // Every rank lists the whole folder: the union of what they saw, and the
                // largest size any saw.
                if pending.same_folder(rank, index, Some(dir)) {
                    pending.files.extend(files.into_iter().map(|f| (f, rank)));
                    pending.bytes = pending.bytes.max(bytes);
                }
            }
            Some(HandIn::Persisted {
                dir, files, bytes, ..
            }) => {
                pending.handed_in = true;
                pending.staged = true;
                pending.same_folder(rank, index, dir);
                // Ranks that hand in a file of the same name (each saving `model.pt`, as
                // Ray Train accepts) share one copy in the folder: the last one persisted.
                // A rank whose every file another rank also handed in adds no bytes.
                let before = pending.files.len();
                for file in files {
                    pending.files.entry(file).or_insert(rank);
                }
                if pending.files.len() > before {
                    pending.bytes += bytes;
                }
            }
        }
        if !pending.reported.iter().all(|r| *r) {
            return Ok(None);
        }
        let Some(done) = self.pending.remove(&index) else {
            return Ok(None);
        };
        if !done.handed_in || done.failed {
            return Ok(None);
        }
        Ok(Some(Commit {
            index,
            metrics: done.rank0_metrics.unwrap_or_default(),
            files: done.files.into_keys().collect(),
            bytes: done.bytes,
            dir: done.dir.flatten(),
            staged: done.staged,
        }))
    }
}

impl Pending {
    /// Whether `dir`, where `rank` put its files for `index`, is where the ranks before it
    /// put theirs; if not, the index is never committed: no folder holds all of it.
    fn same_folder(&mut self, rank: u32, index: u64, dir: Option<String>) -> bool {
        match &self.dir {
            None => {
                self.dir = Some(dir);
                true
            }
            Some(first) if *first == dir => true,
            Some(first) => {
                let name = |dir: &Option<String>| {
                    dir.clone()
                        .unwrap_or_else(|| crate::checkpoint_dir_name(index))
                };
                tracing::warn!(
                    rank,
                    index,
                    folder = %name(&dir),
                    other = %name(first),
                    "ranks handed in checkpoint {index} in different folders; it is not committed: report the same checkpoint path from every rank (NO_UPLOAD), or let trainyard copy every rank's files (SYNC, ASYNC) with the same checkpoint_dir_name or none"
                );
                self.failed = true;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persisted(index: u64, files: &[&str]) -> Option<HandIn> {
        Some(HandIn::Persisted {
            index,
            dir: None,
            files: files.iter().map(|f| (*f).to_owned()).collect(),
            bytes: 1,
        })
    }

    fn persisted_in(dir: &str, index: u64, files: &[&str]) -> Option<HandIn> {
        let mut hand_in = persisted(index, files);
        if let Some(HandIn::Persisted { dir: named, .. }) = &mut hand_in {
            *named = Some(dir.to_owned());
        }
        hand_in
    }

    fn metrics(epoch: i64) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("epoch".into(), epoch.into());
        m
    }

    #[test]
    fn an_index_commits_only_when_every_rank_has_reported_it() {
        let mut book = CheckpointBook::new(3, 0);
        assert!(!book.in_flight());
        assert_eq!(
            book.record(0, metrics(1), persisted(1, &["model.pt"])),
            Ok(None)
        );
        assert!(book.in_flight(), "rank 0 handed in files for index 1");
        assert_eq!(book.record(2, metrics(1), None), Ok(None));
        let commit = book.record(1, metrics(1), None).unwrap().unwrap();
        assert!(!book.in_flight());
        assert_eq!(commit.index, 1);
        assert_eq!(commit.files, vec!["model.pt".to_owned()]);
        assert_eq!(commit.metrics, metrics(1));
    }

    #[test]
    fn an_index_every_ended_rank_reported_can_still_commit() {
        let mut book = CheckpointBook::new(3, 0);
        assert_eq!(book.completable(&[false, false, true]), None);
        // Rank 2 handed in index 1 and ended; ranks 0 and 1 are still on their way.
        book.record(2, metrics(1), persisted(1, &["shard_2"]))
            .unwrap();
        assert_eq!(book.completable(&[false, false, true]), Some(1));
        // Rank 0 ended without reporting it: index 1 can never commit.
        assert_eq!(book.completable(&[true, false, true]), None);
        // Index 2, reported by every rank that ended, with files.
        book.record(2, metrics(2), persisted(2, &["shard_2"]))
            .unwrap();
        book.record(0, metrics(1), None).unwrap();
        book.record(0, metrics(2), None).unwrap();
        assert_eq!(book.completable(&[true, false, true]), Some(1));
        // Reports without files: nothing to wait for.
        let mut plain = CheckpointBook::new(2, 0);
        plain.record(1, metrics(1), None).unwrap();
        assert_eq!(plain.completable(&[false, true]), None);
        // A failed hand-in: neither.
        let mut failed = CheckpointBook::new(2, 0);
        failed
            .record(
                1,
                metrics(1),
                Some(HandIn::Failed {
                    index: 1,
                    error: "disk full".into(),
                }),
            )
            .unwrap();
        assert_eq!(failed.completable(&[false, true]), None);
    }

    #[test]
    fn reports_without_files_commit_nothing_but_still_count() {
        let mut book = CheckpointBook::new(2, 0);
        for rank in 0..2 {
            assert_eq!(book.record(rank, metrics(1), None), Ok(None));
        }
        assert_eq!(book.next_index(0), 2);
        assert_eq!(book.record(0, metrics(2), persisted(2, &["a"])), Ok(None));
        assert_eq!(book.record(1, metrics(2), None).unwrap().unwrap().index, 2);
    }

    #[test]
    fn a_failed_hand_in_keeps_its_index_from_committing() {
        let mut book = CheckpointBook::new(2, 5);
        book.record(0, metrics(1), persisted(6, &["a"])).unwrap();
        let failed = Some(HandIn::Failed {
            index: 6,
            error: "no space left on device".into(),
        });
        assert_eq!(book.record(1, metrics(1), failed), Ok(None));
        // The next index is unaffected.
        book.record(0, metrics(2), persisted(7, &["a"])).unwrap();
        assert_eq!(
            book.record(1, metrics(2), persisted(7, &["b"]))
                .unwrap()
                .unwrap()
                .index,
            7
        );
    }

    #[test]
    fn ranks_writing_one_name_commit_one_file_counted_once() {
        let mut book = CheckpointBook::new(3, 0);
        book.record(1, metrics(1), persisted(1, &["model.pt"]))
            .unwrap();
        book.record(2, metrics(1), persisted(1, &["model.pt", "extra_2"]))
            .unwrap();
        let commit = book
            .record(0, metrics(1), persisted(1, &["model.pt"]))
            .unwrap()
            .expect("every rank reported");
        assert_eq!(commit.files, ["extra_2", "model.pt"]);
        assert_eq!(commit.bytes, 2, "rank 0's copy of model.pt adds nothing");
    }

    fn in_storage(index: u64, dir: &str, files: &[&str], bytes: u64) -> Option<HandIn> {
        Some(HandIn::InStorage {
            index,
            dir: dir.to_owned(),
            files: files.iter().map(|f| (*f).to_owned()).collect(),
            bytes,
        })
    }

    #[test]
    fn a_folder_registered_by_every_rank_commits_once_with_what_they_saw() {
        let mut book = CheckpointBook::new(3, 0);
        book.record(0, metrics(1), in_storage(1, "dcp/1", &["__0_0.distcp"], 10))
            .unwrap();
        book.record(1, metrics(1), None).unwrap();
        let commit = book
            .record(
                2,
                metrics(1),
                in_storage(1, "dcp/1", &["__0_0.distcp", "__2_0.distcp"], 20),
            )
            .unwrap()
            .expect("every rank reported");
        assert_eq!(commit.dir.as_deref(), Some("dcp/1"));
        assert_eq!(commit.files, ["__0_0.distcp", "__2_0.distcp"]);
        assert_eq!(commit.bytes, 20, "each rank listed the whole folder");
        // A copied checkpoint keeps its index's own folder.
        book.record(0, metrics(2), persisted(2, &["a"])).unwrap();
        book.record(1, metrics(2), None).unwrap();
        let copied = book
            .record(2, metrics(2), None)
            .unwrap()
            .expect("committed");
        assert_eq!(copied.dir, None);
    }

    #[test]
    fn ranks_handing_in_one_index_in_different_folders_commit_nothing() {
        let mut book = CheckpointBook::new(2, 0);
        book.record(0, metrics(1), in_storage(1, "dcp/1", &["a"], 1))
            .unwrap();
        assert_eq!(
            book.record(1, metrics(1), in_storage(1, "dcp/1-rank1", &["b"], 1)),
            Ok(None)
        );
        book.record(0, metrics(2), in_storage(2, "dcp/2", &["a"], 1))
            .unwrap();
        assert_eq!(book.record(1, metrics(2), persisted(2, &["b"])), Ok(None));
        // The next index is unaffected.
        book.record(1, metrics(3), in_storage(3, "dcp/3", &["b"], 1))
            .unwrap();
        let commit = book
            .record(0, metrics(3), in_storage(3, "dcp/3", &["a"], 1))
            .unwrap()
            .expect("committed");
        assert_eq!(
            (commit.index, commit.files),
            (3, vec!["a".to_owned(), "b".to_owned()])
        );
    }

    #[test]
    fn a_named_folder_commits_with_files_copied_in_and_registered_there_mixed() {
        let mut book = CheckpointBook::new(2, 0);
        // Rank 0 has its files copied into `iteration_1`; rank 1 wrote its own there.
        book.record(0, metrics(1), persisted_in("iteration_1", 1, &["shard_0"]))
            .unwrap();
        let commit = book
            .record(1, metrics(1), in_storage(1, "iteration_1", &["shard_1"], 1))
            .unwrap()
            .expect("both in one folder");
        assert_eq!(commit.dir.as_deref(), Some("iteration_1"));
        assert_eq!(commit.files, ["shard_0", "shard_1"]);
        // Copied by both ranks into one named folder.
        book.record(1, metrics(2), persisted_in("iteration_2", 2, &["shard_1"]))
            .unwrap();
        let commit = book
            .record(0, metrics(2), persisted_in("iteration_2", 2, &["shard_0"]))
            .unwrap()
            .expect("both in one folder");
        assert_eq!(commit.dir.as_deref(), Some("iteration_2"));
        // A named folder and the index's own are two folders.
        book.record(0, metrics(3), persisted_in("iteration_3", 3, &["shard_0"]))
            .unwrap();
        assert_eq!(
            book.record(1, metrics(3), persisted(3, &["shard_1"])),
            Ok(None)
        );
    }

    #[test]
    fn a_rank_outside_the_run_is_refused() {
        let mut book = CheckpointBook::new(2, 0);
        assert!(matches!(
            book.record(2, metrics(1), None),
            Err(BookError::UnknownRank { rank: 2, .. })
        ));
    }
}
