//! The conformance suite of storage: the same behaviour checks, run against every kind of
//! storage, as object_store's `integration.rs` is run against every store.
//! `tests/conformance.rs` runs it against a local folder and against S3 (moto, through
//! [`super::S3Server`]).
//!
//! Each check takes a [`Storage`] and panics, naming what differs, at the first behaviour
//! that is not the one a run folder owes its callers. The checks go through [`Storage`] and
//! [`RunFolder`], the API every caller uses, so they check each store and the code above it
//! at once. Each check names runs of its own (`record`, `lease`, `listed-a`…), so the checks
//! may share one storage; [`run_all`] runs them all.
//!
//! Where local and S3 storage differ on purpose, the check says so and asserts each side:
//! - a run folder's owners and modes are checked only on a file system; S3 has no owners
//!   ([`run_folders_are_trusted_only_where_they_have_owners`]);
//! - a local checkpoint or attempt's logs is read in place, S3's is downloaded into private
//!   folders: folders 0700, files 0600 ([`a_checkpoint_is_downloaded_and_a_gone_one_is_an_error`],
//!   [`attempt_logs_are_uploaded_and_fetched`]);
//! - the run names of a local storage are the folders that hold a `run.json`, S3's every
//!   folder, in one listing ([`runs_are_listed_by_name_sorted`]);
//! - a staged checkpoint is committed by a rename per file on a file system, by a copy on the
//!   server per object on S3: both leave the same files in the same folders
//!   ([`a_replaced_attempt_cannot_write_into_a_checkpoint_folder`]);
//! - local metrics are appended, S3's replaced by every line the driver holds: a driver
//!   passes both, so both read back the same ([`metrics_are_appended_read_and_tailed`]).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use trainyard_sys::private::{self, TempDir};

use crate::{
    CheckpointWriter, HandIn, Lease, RunFolder, RunRecord, STAGING_DIR, Storage, StorageError,
    attempt_logs_dir_name, checkpoint_dir_name,
};

/// Every check, one after the other, on `storage`: it may hold other runs, but none of the
/// names the checks use, and a local storage's root is made by the first check.
pub async fn run_all(storage: &Storage) {
    storage_is_checked_writable(storage).await;
    run_json_is_written_read_and_replaced(storage).await;
    the_lease_is_written_read_and_replaced(storage).await;
    runs_are_listed_by_name_sorted(storage).await;
    a_checkpoint_is_persisted_and_verified(storage).await;
    a_checkpoint_is_deleted(storage).await;
    a_replaced_attempt_cannot_write_into_a_checkpoint_folder(storage).await;
    uncommitted_checkpoints_are_deleted_and_the_rest_kept(storage).await;
    metrics_are_appended_read_and_tailed(storage).await;
    attempt_logs_are_uploaded_and_fetched(storage).await;
    a_checkpoint_is_downloaded_and_a_gone_one_is_an_error(storage).await;
    a_folder_written_into_the_run_folder_is_registered_where_it_is(storage).await;
    folders_outside_the_run_folder_are_refused(storage).await;
    a_run_folder_is_deleted_whole(storage).await;
    run_folders_are_trusted_only_where_they_have_owners(storage).await;
}

/// The files a rank hands in: two, one in a sub-folder.
const SHARD: [(&str, &[u8]); 2] = [("model.pt", b"weights"), ("sub/optim.pt", b"optimiser")];

/// The names of [`SHARD`], sorted.
fn shard_names() -> Vec<String> {
    SHARD.iter().map(|(name, _)| (*name).to_owned()).collect()
}

/// The size of `files` in bytes.
fn size(files: &[(&str, &[u8])]) -> u64 {
    files.iter().map(|(_, bytes)| bytes.len() as u64).sum()
}

/// A fresh private folder holding `files`, removed when dropped.
fn scratch(files: &[(&str, &[u8])]) -> TempDir {
    let dir = private::temp_dir("trainyard-conformance-").expect("a scratch folder is made");
    for (name, bytes) in files {
        let path = dir.path().join(name);
        let parent = path.parent().expect("a file's path has a folder");
        private::dir_all(parent).expect("a scratch sub-folder is made");
        private::write(&path, bytes).expect("a scratch file is written");
    }
    dir
}

/// Asserts that `dir` holds `files`, byte for byte.
fn assert_holds(dir: &Path, files: &[(&str, &[u8])]) {
    for (name, bytes) in files {
        let read = std::fs::read(dir.join(name)).expect("a fetched file reads");
        assert_eq!(read, *bytes, "{name} in {}", dir.display());
    }
}

/// The mode bits of `path`.
fn mode(path: &Path) -> u32 {
    let meta = std::fs::metadata(path).expect("the path's metadata reads");
    meta.permissions().mode() & 0o777
}

/// Asserts that what a remote store downloaded into `dir` is this user's alone: folders 0700,
/// files 0600 (`trainyard_sys::private`).
fn assert_private(dir: &Path, files: &[(&str, &[u8])]) {
    assert_eq!(mode(dir), 0o700, "{}", dir.display());
    for (name, _) in files {
        let file = dir.join(name);
        assert_eq!(mode(&file), 0o600, "{}", file.display());
        let parent = file.parent().expect("a file's path has a folder");
        assert_eq!(mode(parent), 0o700, "{}", parent.display());
    }
}

/// Persists [`SHARD`] as checkpoint `index` of `folder`.
async fn persist_shard(folder: &RunFolder, index: u64) {
    let shard = scratch(&SHARD);
    folder
        .persist_directory(index, shard.path())
        .await
        .expect("a checkpoint is persisted");
}

/// The error of `result`, which must have failed.
fn failure<T: std::fmt::Debug>(result: Result<T, StorageError>, what: &str) -> StorageError {
    match result {
        Ok(value) => panic!("{what} succeeded ({value:?}) where it must fail"),
        Err(error) => error,
    }
}

/// Asserts that `error` says that the checkpoint folder at `path` misses `file`.
fn assert_missing(error: &StorageError, path: &str, file: &str) {
    assert!(
        matches!(error, StorageError::CheckpointMissing { path: p, file: f } if p == path && f == file),
        "expected `{path}` to miss `{file}`: {error:?}"
    );
}

/// A probe is written, read back and deleted at the storage's root (made first, locally).
pub async fn storage_is_checked_writable(storage: &Storage) {
    storage
        .check_writable()
        .await
        .expect("the storage is writable");
}

/// `run.json` is absent until saved, then read back as saved, and replaced whole.
pub async fn run_json_is_written_read_and_replaced(storage: &Storage) {
    let folder = storage.run("record");
    assert_eq!(folder.load().await.expect("a missing record reads"), None);
    assert!(!storage.has_run("record").await.expect("asked"));
    folder.prepare().await.expect("the run folder is prepared");
    let mut record = RunRecord::new("record");
    folder.save(&record).await.expect("the record is saved");
    assert_eq!(folder.load().await.expect("loaded"), Some(record.clone()));
    assert!(storage.has_run("record").await.expect("asked"));
    record.last_index = 3;
    folder.save(&record).await.expect("the record is replaced");
    assert_eq!(folder.load().await.expect("loaded"), Some(record));
}

/// The lease is absent until written, then read back, and replaced whole.
pub async fn the_lease_is_written_read_and_replaced(storage: &Storage) {
    let folder = storage.run("lease");
    assert_eq!(folder.read_lease().await, None);
    let mut lease = Lease {
        host: "node-1".to_owned(),
        pid: 42,
        renewed_at: 1_000.5,
    };
    folder
        .write_lease(&lease)
        .await
        .expect("the lease is written");
    assert_eq!(folder.read_lease().await, Some(lease.clone()));
    lease.renewed_at = 1_010.5;
    folder
        .write_lease(&lease)
        .await
        .expect("the lease is renewed");
    assert_eq!(folder.read_lease().await, Some(lease));
}

/// The runs of a storage are listed by name, sorted. A folder without a `run.json` differs on
/// purpose: a local storage leaves it out, S3 lists it (one listing, however many objects;
/// [`RunFolder::load`] tells that it holds no record).
pub async fn runs_are_listed_by_name_sorted(storage: &Storage) {
    for name in ["listed-b", "listed-a"] {
        let record = RunRecord::new(name);
        storage.run(name).save(&record).await.expect("saved");
    }
    let logs = scratch(&[("rank_0.log", b"started\n")]);
    let bare = storage.run("listed-c");
    bare.upload_directory(&attempt_logs_dir_name(0), logs.path())
        .await
        .expect("a folder without a record is written");
    let names = storage.run_names().await.expect("the runs are listed");
    let listed: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|name| name.starts_with("listed-"))
        .collect();
    if storage.location().is_local() {
        assert_eq!(listed, ["listed-a", "listed-b"]);
    } else {
        assert_eq!(listed, ["listed-a", "listed-b", "listed-c"]);
    }
    assert_eq!(bare.load().await.expect("a bare folder reads"), None);
}

/// A rank's folder is persisted as a checkpoint with its files sorted and its size; every
/// file is then verified, and a file that is not there is named.
pub async fn a_checkpoint_is_persisted_and_verified(storage: &Storage) {
    let folder = storage.run("persisted");
    let shard = scratch(&SHARD);
    let hand_in = folder
        .persist_directory(1, shard.path())
        .await
        .expect("a checkpoint is persisted");
    let expected = HandIn::Persisted {
        index: 1,
        dir: None,
        files: shard_names(),
        bytes: size(&SHARD),
    };
    assert_eq!(hand_in, expected);
    let dir = checkpoint_dir_name(1);
    folder
        .verify_checkpoint(&dir, &shard_names())
        .await
        .expect("every file is there");
    let more = [shard_names(), vec!["extra.pt".to_owned()]].concat();
    let error = failure(folder.verify_checkpoint(&dir, &more).await, "verify");
    assert_missing(&error, &folder.checkpoint_uri(1), "extra.pt");
}

/// The files of checkpoint folder `dir` of `folder`, by name (fetched, from remote storage).
async fn checkpoint_files(folder: &RunFolder, dir: &str) -> Vec<(String, Vec<u8>)> {
    let dest = scratch(&[]);
    let fetched = folder
        .download_checkpoint(dir, &dest.path().join("ckpt"))
        .await
        .expect("the checkpoint is fetched");
    crate::storage::walk(&fetched)
        .expect("the checkpoint is listed")
        .into_iter()
        .map(|file| {
            let bytes = std::fs::read(&file.path).expect("a fetched file reads");
            (file.name, bytes)
        })
        .collect()
}

/// [`SHARD`], as [`checkpoint_files`] lists it.
fn shard_files() -> Vec<(String, Vec<u8>)> {
    SHARD
        .iter()
        .map(|(name, bytes)| ((*name).to_owned(), bytes.to_vec()))
        .collect()
}

/// The fence between attempts: a writer of an attempt stages what it persists, and the
/// driver moves the current attempt's files into the checkpoint folder when it commits them.
/// A writer of the attempt before it (replaced, and still running) that persists the same
/// index before the commit, after it, in a folder a report named, or `ASYNC`, leaves the
/// committed folder holding exactly the current attempt's files (beside those a rank wrote
/// into the folder itself). Nothing can be named [`STAGING_DIR`].
pub async fn a_replaced_attempt_cannot_write_into_a_checkpoint_folder(storage: &Storage) {
    let folder = storage.run("fenced");
    folder.prepare().await.expect("the run folder is made");
    let stale = CheckpointWriter::new(folder.clone()).for_attempt(2);
    let current = CheckpointWriter::new(folder.clone()).for_attempt(3);
    let stale_shard: [(&str, &[u8]); 2] = [("model.pt", b"stale"), ("stale.pt", b"left over")];
    let stale_files = scratch(&stale_shard);
    let persist_stale = async |name: Option<&str>| {
        let hand_in = stale.hand_in(14, name, stale_files.path()).await;
        assert!(
            matches!(hand_in, HandIn::Persisted { .. }),
            "a stale writer persists into its own staging: {hand_in:?}"
        );
    };
    // Before the current attempt writes, as it writes, and after it committed.
    persist_stale(None).await;
    persist_stale(Some("named")).await;
    let shard = scratch(&SHARD);
    for name in [None, Some("named")] {
        let hand_in = current.hand_in(14, name, shard.path()).await;
        assert!(matches!(hand_in, HandIn::Persisted { .. }), "{hand_in:?}");
    }
    persist_stale(None).await;
    // A rank's own files (`NO_UPLOAD`) in the named folder: the staged ones join them.
    let own: [(&str, &[u8]); 1] = [("own.pt", b"written in place")];
    folder
        .upload_directory("named", scratch(&own).path())
        .await
        .expect("a rank writes into the run folder");
    let dir = checkpoint_dir_name(14);
    let dest = scratch(&[]);
    let error = failure(
        folder
            .download_checkpoint(&dir, &dest.path().join("early"))
            .await,
        "a checkpoint folder before the driver commits it",
    );
    assert_missing(&error, &folder.checkpoint_uri(14), "*");
    for committed in [dir.as_str(), "named"] {
        folder
            .commit_staged(3, committed)
            .await
            .expect("the current attempt's files are committed");
    }
    persist_stale(None).await;
    persist_stale(Some("named")).await;
    let taken = stale
        .take(stale_files.path(), false)
        .await
        .expect("an ASYNC hand-in is taken");
    let hand_in = stale.hand_in_taken(14, None, &taken).await;
    assert!(matches!(hand_in, HandIn::Persisted { .. }), "{hand_in:?}");
    taken.remove().await;
    assert_eq!(
        checkpoint_files(&folder, &dir).await,
        shard_files(),
        "the checkpoint holds exactly the current attempt's files"
    );
    let mut named = shard_files();
    named.insert(1, ("own.pt".to_owned(), own[0].1.to_vec()));
    assert_eq!(checkpoint_files(&folder, "named").await, named);
    // Committing again finds nothing staged, and leaves the folder as it is.
    folder.commit_staged(3, &dir).await.expect("nothing staged");
    assert_eq!(checkpoint_files(&folder, &dir).await, shard_files());
    folder.delete_staging().await.expect("staging is deleted");
    assert_eq!(checkpoint_files(&folder, &dir).await, shard_files());
    let error = failure(
        current
            .persist_named(15, Some(STAGING_DIR), shard.path())
            .await,
        "persist into the staging folder",
    );
    assert!(
        matches!(error, StorageError::CheckpointDirName { .. }),
        "{error:?}"
    );
}

/// A deleted checkpoint is gone; deleting it again is no error.
pub async fn a_checkpoint_is_deleted(storage: &Storage) {
    let folder = storage.run("deleted");
    persist_shard(&folder, 1).await;
    let dir = checkpoint_dir_name(1);
    folder.delete_checkpoint(&dir).await.expect("deleted");
    let error = failure(
        folder.verify_checkpoint(&dir, &shard_names()).await,
        "verify",
    );
    assert_missing(&error, &folder.checkpoint_uri(1), "model.pt");
    folder.delete_checkpoint(&dir).await.expect("deleted again");
}

/// The checkpoints above the committed index are deleted, and said; the committed one, the
/// record and the lease stay.
pub async fn uncommitted_checkpoints_are_deleted_and_the_rest_kept(storage: &Storage) {
    let folder = storage.run("uncommitted");
    for index in [1, 2, 3] {
        persist_shard(&folder, index).await;
    }
    folder
        .save(&RunRecord::new("uncommitted"))
        .await
        .expect("saved");
    let lease = Lease {
        host: "node-1".to_owned(),
        pid: 7,
        renewed_at: 1.0,
    };
    folder
        .write_lease(&lease)
        .await
        .expect("the lease is written");
    assert_eq!(folder.delete_uncommitted(1).await.expect("deleted"), [2, 3]);
    assert!(
        folder
            .delete_uncommitted(1)
            .await
            .expect("deleted")
            .is_empty()
    );
    let names = shard_names();
    folder
        .verify_checkpoint(&checkpoint_dir_name(1), &names)
        .await
        .expect("the committed checkpoint stays");
    let error = failure(
        folder
            .verify_checkpoint(&checkpoint_dir_name(2), &names)
            .await,
        "verify",
    );
    assert_missing(&error, &folder.checkpoint_uri(2), "model.pt");
    assert!(
        folder.load().await.expect("loaded").is_some(),
        "run.json stays"
    );
    assert_eq!(folder.read_lease().await, Some(lease), "the lease stays");
}

/// The metrics history reads back as written, its tail is its last bytes, and both are empty
/// before anything is written. A local disk appends the new lines, S3 replaces the object with
/// every line: a driver passes both, so both read back the same.
pub async fn metrics_are_appended_read_and_tailed(storage: &Storage) {
    let folder = storage.run("metrics");
    // A driver writes metrics into the folder it prepared.
    folder.prepare().await.expect("the run folder is prepared");
    assert!(folder.read_metrics().await.expect("read").is_empty());
    assert!(folder.metrics_tail(10).await.expect("read").is_empty());
    let (first, second) = (&b"{\"step\":1}\n"[..], &b"{\"step\":2}\n"[..]);
    let all = [first, second].concat();
    folder.write_metrics(first, first).await.expect("written");
    folder.write_metrics(second, &all).await.expect("written");
    assert_eq!(folder.read_metrics().await.expect("read"), all);
    let tail = folder
        .metrics_tail(second.len() as u64)
        .await
        .expect("read");
    assert_eq!(tail, second);
    let whole = folder.metrics_tail(1 << 20).await.expect("read");
    assert_eq!(whole, all, "a tail longer than the history is all of it");
}

/// An attempt's logs are uploaded into the run folder and fetched back; there are none before.
/// A local run folder's own folder is returned (nothing is copied); S3's copy is downloaded
/// into the folder asked for, private.
pub async fn attempt_logs_are_uploaded_and_fetched(storage: &Storage) {
    let folder = storage.run("logs");
    let dest = scratch(&[]);
    let into = dest.path().join("attempt_0");
    let none = folder.attempt_logs(0, &into).await.expect("asked");
    assert_eq!(none, None, "no logs before any upload");
    let logs: [(&str, &[u8]); 2] = [("rank_0.log", b"rank 0\n"), ("rank_1.log", b"rank 1\n")];
    let source = scratch(&logs);
    let bytes = folder
        .upload_directory(&attempt_logs_dir_name(0), source.path())
        .await
        .expect("the logs are uploaded");
    assert_eq!(bytes, size(&logs));
    let fetched = folder.attempt_logs(0, &into).await.expect("fetched");
    let fetched = fetched.expect("the logs are there");
    assert_holds(&fetched, &logs);
    if let Some(own) = folder.dir_local_path(&attempt_logs_dir_name(0)) {
        assert_eq!(fetched, own, "read in place");
    } else {
        assert_eq!(fetched, into, "downloaded where asked");
        assert_private(&fetched, &logs);
    }
}

/// A checkpoint is fetched whole; one that is gone is [`StorageError::CheckpointMissing`]. A
/// local checkpoint is read in place (nothing is copied); S3's is downloaded into the folder
/// asked for, private.
pub async fn a_checkpoint_is_downloaded_and_a_gone_one_is_an_error(storage: &Storage) {
    let folder = storage.run("downloaded");
    persist_shard(&folder, 1).await;
    let dir = checkpoint_dir_name(1);
    let dest = scratch(&[]);
    let into = dest.path().join("ckpt");
    let fetched = folder
        .download_checkpoint(&dir, &into)
        .await
        .expect("the checkpoint is fetched");
    assert_holds(&fetched, &SHARD);
    if let Some(own) = folder.dir_local_path(&dir) {
        assert_eq!(fetched, own, "read in place");
    } else {
        assert_eq!(fetched, into, "downloaded where asked");
        assert_private(&fetched, &SHARD);
    }
    folder.delete_checkpoint(&dir).await.expect("deleted");
    let again = dest.path().join("again");
    let error = failure(folder.download_checkpoint(&dir, &again).await, "download");
    assert_missing(&error, &folder.checkpoint_uri(1), "*");
}

/// A folder a rank wrote into the run folder is registered where it is, its files listed;
/// one of trainyard's own, one that is not there, and another run's are refused.
pub async fn a_folder_written_into_the_run_folder_is_registered_where_it_is(storage: &Storage) {
    let folder = storage.run("registered");
    let shard = scratch(&SHARD);
    folder
        .upload_directory("dcp/step_1", shard.path())
        .await
        .expect("the rank's folder is written");
    let hand_in = folder
        .register_directory(1, &folder.dir_uri("dcp/step_1"))
        .await
        .expect("the folder is registered");
    let expected = HandIn::InStorage {
        index: 1,
        dir: "dcp/step_1".to_owned(),
        files: shard_names(),
        bytes: size(&SHARD),
    };
    assert_eq!(hand_in, expected);
    let other = storage.run("registered-other");
    other
        .upload_directory("dcp/step_1", shard.path())
        .await
        .expect("another run's folder is written");
    for refused in [
        folder.dir_uri(&attempt_logs_dir_name(0)),
        folder.dir_uri("dcp/step_2"),
        other.dir_uri("dcp/step_1"),
    ] {
        let error = failure(folder.register_directory(2, &refused).await, &refused);
        assert!(
            matches!(error, StorageError::NotInRunFolder { .. }),
            "{refused}: {error:?}"
        );
    }
}

/// A checkpoint folder a record names is read or deleted only inside the run folder.
pub async fn folders_outside_the_run_folder_are_refused(storage: &Storage) {
    let folder = storage.run("outside");
    let dest = scratch(&[]);
    for dir in ["", ".", "../other/checkpoint_000001", "/etc"] {
        let refused = |error: &StorageError| matches!(error, StorageError::NotACheckpointFolder { dir: d, .. } if d == dir);
        let error = failure(folder.verify_checkpoint(dir, &[]).await, "verify");
        assert!(refused(&error), "verify `{dir}`: {error:?}");
        let error = failure(folder.delete_checkpoint(dir).await, "delete");
        assert!(refused(&error), "delete `{dir}`: {error:?}");
        let error = failure(
            folder.download_checkpoint(dir, dest.path()).await,
            "download",
        );
        assert!(refused(&error), "download `{dir}`: {error:?}");
    }
}

/// A run folder is deleted with everything in it; deleting it again is no error.
pub async fn a_run_folder_is_deleted_whole(storage: &Storage) {
    let folder = storage.run("gone");
    folder.save(&RunRecord::new("gone")).await.expect("saved");
    persist_shard(&folder, 1).await;
    folder.delete().await.expect("deleted");
    assert_eq!(folder.load().await.expect("read"), None);
    assert!(!storage.has_run("gone").await.expect("asked"));
    let error = failure(
        folder
            .verify_checkpoint(&checkpoint_dir_name(1), &shard_names())
            .await,
        "verify",
    );
    assert_missing(&error, &folder.checkpoint_uri(1), "model.pt");
    folder.delete().await.expect("deleted again");
}

/// The trust checks of a run folder, which differ on purpose: on a file system a run folder
/// is made private (0700), and one that another user could have changed (writable by others
/// here) is refused before it is written to or read; S3 has no owners, and checks nothing.
pub async fn run_folders_are_trusted_only_where_they_have_owners(storage: &Storage) {
    let folder = storage.run("trusted");
    folder.prepare().await.expect("the run folder is prepared");
    folder
        .save(&RunRecord::new("trusted"))
        .await
        .expect("saved");
    let Some(dir) = folder.local_path() else {
        // S3: no owners, nothing to refuse.
        folder.prepare().await.expect("prepared again");
        assert!(folder.load().await.expect("loaded").is_some());
        return;
    };
    assert_eq!(mode(&dir), 0o700, "a run folder is private");
    set_mode(&dir, 0o777);
    let refused = |error: &StorageError| matches!(error, StorageError::Untrusted { .. });
    let prepared = failure(folder.prepare().await, "prepare");
    let loaded = failure(folder.load().await, "load");
    set_mode(&dir, 0o700);
    assert!(refused(&prepared), "prepare: {prepared:?}");
    assert!(refused(&loaded), "load: {loaded:?}");
    let record = dir.join(crate::RUN_FILE);
    set_mode(&record, 0o666);
    let loaded = failure(folder.load().await, "load");
    set_mode(&record, 0o644);
    assert!(refused(&loaded), "a record others may write: {loaded:?}");
    assert!(folder.load().await.expect("loaded").is_some());
}

/// Sets the mode bits of `path`.
fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("the mode is set");
}
