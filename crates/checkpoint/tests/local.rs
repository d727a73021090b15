//! Run folders on a local file system: persisting, atomicity, clean-up, restores.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use trainyard_checkpoint::{
    CHECKPOINT, CHECKPOINT_ATTEMPT, CHECKPOINT_MAX_BYTES, CHECKPOINT_MAX_FILES, CHECKPOINT_URI,
    CheckpointRecord, CheckpointWriter, HandIn, HandInLimits, RUN_DIR, RunFolder, RunRecord,
    Storage, StorageError, StorageLocation, checkpoint_dir_name, prepare_task_env,
};

/// `len` bytes that differ from file to file (by `seed`).
fn write_file(path: &Path, len: usize, seed: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    std::fs::write(path, data).unwrap();
}

fn storage(root: &Path) -> Storage {
    Storage::open(StorageLocation::Local(root.to_path_buf()), &BTreeMap::new()).unwrap()
}

/// Every file under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let name = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &name, out);
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

fn is_temp(name: &str) -> bool {
    name.rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with('.') && n.contains(".part-"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_s_directory_is_persisted_with_nested_names_sorted_and_its_size() {
    let source = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    write_file(&source.path().join("model.pt"), 3 << 20, 1);
    write_file(&source.path().join("optim/state.bin"), 17, 2);
    write_file(&source.path().join("b/c/d.txt"), 0, 3);
    let folder = storage(root.path()).run("mnist");

    let hand_in = folder.persist_directory(3, source.path()).await.unwrap();

    assert_eq!(
        hand_in,
        HandIn::Persisted {
            index: 3,
            dir: None,
            files: vec![
                "b/c/d.txt".into(),
                "model.pt".into(),
                "optim/state.bin".into()
            ],
            bytes: (3 << 20) + 17,
        }
    );
    let dir = root.path().join("mnist/checkpoint_000003");
    assert_eq!(
        folder.dir_local_path(&checkpoint_dir_name(3)),
        Some(dir.clone())
    );
    assert_eq!(
        files_under(&dir),
        ["b/c/d.txt", "model.pt", "optim/state.bin"]
    );
    for name in ["model.pt", "optim/state.bin", "b/c/d.txt"] {
        assert_eq!(
            std::fs::read(dir.join(name)).unwrap(),
            std::fs::read(source.path().join(name)).unwrap(),
            "{name}"
        );
    }
    let HandIn::Persisted { files, .. } = hand_in else {
        unreachable!()
    };
    folder
        .verify_checkpoint(&checkpoint_dir_name(3), &files)
        .await
        .unwrap();
    // A local checkpoint is restored in place.
    let restored = folder
        .download_checkpoint(&checkpoint_dir_name(3), Path::new("/nonexistent"))
        .await
        .unwrap();
    assert_eq!(restored, dir);
    assert_eq!(
        folder.uri(),
        root.path().join("mnist").display().to_string()
    );
    assert_eq!(folder.checkpoint_uri(3), dir.display().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_persist_their_own_files_into_one_checkpoint_at_once() {
    let root = tempfile::tempdir().unwrap();
    let sources = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for (rank, source) in sources.iter().enumerate() {
        for shard in 0..4 {
            write_file(
                &source.path().join(format!("shards/rank{rank}_{shard}.pt")),
                (1 << 20) + shard,
                rank as u8,
            );
        }
    }
    let folder = storage(root.path()).run("run");
    let (a, b) = tokio::join!(
        folder.persist_directory(1, sources[0].path()),
        folder.persist_directory(1, sources[1].path())
    );
    a.unwrap();
    b.unwrap();
    let dir = root.path().join("run").join(checkpoint_dir_name(1));
    let files = files_under(&dir);
    assert_eq!(files.len(), 8, "{files:?}");
    assert!(files.iter().all(|f| !is_temp(f)), "{files:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_file_is_ever_visible_under_its_final_name_before_it_is_complete() {
    const LEN: u64 = 48 << 20;
    let source = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    for i in 0..3 {
        write_file(&source.path().join(format!("part{i}.bin")), LEN as usize, i);
    }
    let folder = storage(root.path()).run("run");
    let dir = root.path().join("run").join(checkpoint_dir_name(1));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (done, dir) = (Arc::clone(&done), dir.clone());
        std::thread::spawn(move || {
            let (mut looks, mut seen_temp) = (0_u64, false);
            while !done.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = entry.file_name().into_string().unwrap();
                    if is_temp(&name) {
                        seen_temp = true;
                    } else if let Ok(meta) = std::fs::metadata(entry.path()) {
                        assert_eq!(meta.len(), LEN, "{name} is visible while incomplete");
                    }
                }
                looks += 1;
            }
            (looks, seen_temp)
        })
    };
    folder.persist_directory(1, source.path()).await.unwrap();
    done.store(true, Ordering::Relaxed);
    let (looks, seen_temp) = watcher.join().unwrap();
    assert!(looks > 0);
    // The watcher usually catches a copy under way; it proves the point only then.
    eprintln!("the watcher looked {looks} times; saw a temporary file: {seen_temp}");
    assert_eq!(files_under(&dir), ["part0.bin", "part1.bin", "part2.bin"]);
}

/// A 1 MiB tmpfs, unmounted when dropped; `None` when mounting is not permitted.
struct SmallDisk {
    path: PathBuf,
    /// Removed once unmounted.
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Self {
                path: dir.path().to_path_buf(),
                _dir: dir,
            }),
            Ok(output) => {
                eprintln!(
                    "SKIP: a full disk is simulated with a 1 MiB tmpfs, which cannot be mounted here: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(error) => {
                eprintln!(
                    "SKIP: a full disk is simulated with a 1 MiB tmpfs; `mount` cannot run: {error}"
                );
                None
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_mid_copy_fails_the_report_and_leaves_nothing_under_a_final_name() {
    let Some(disk) = SmallDisk::mount() else {
        return;
    };
    let source = tempfile::tempdir().unwrap();
    write_file(&source.path().join("a_small.txt"), 100 << 10, 1);
    write_file(&source.path().join("big/weights.bin"), 4 << 20, 2);
    write_file(&source.path().join("z_small.txt"), 100 << 10, 3);
    let folder = storage(&disk.path).run("run");

    let error = folder
        .persist_directory(1, source.path())
        .await
        .unwrap_err();

    let text = trainyard_config::resources::ErrorChain(&error).to_string();
    assert!(matches!(error, StorageError::Copy { .. }), "{error:?}");
    assert!(text.contains("No space left on device"), "{text}");
    assert!(
        text.contains(
            &disk
                .path
                .join("run/checkpoint_000001")
                .display()
                .to_string()
        ),
        "{text}"
    );
    let left = files_under(&disk.path.join("run"));
    assert!(
        left.iter().all(|f| is_temp(f)),
        "files under a final name: {left:?}"
    );
    assert!(left.is_empty(), "temporary files are removed too: {left:?}");

    // Through the writer, the same failure is a hand-in that fails the index.
    let writer = CheckpointWriter::new(folder);
    match writer.hand_in(2, None, source.path()).await {
        HandIn::Failed { index: 2, error } => assert!(error.contains("No space left"), "{error}"),
        other => panic!("expected a failed hand-in, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_is_not_a_directory_is_refused_and_handed_in_as_failed() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("model.pt");
    write_file(&file, 10, 0);
    let folder = storage(root.path()).run("run");
    for source in [file.clone(), root.path().join("missing")] {
        let error = folder.persist_directory(1, &source).await.unwrap_err();
        assert!(
            matches!(&error, StorageError::NotADirectory { path } if *path == source.display().to_string()),
            "{error:?}"
        );
    }
    let mut env = BTreeMap::new();
    assert!(CheckpointWriter::from_env(&env).unwrap().is_none());
    env.insert(
        RUN_DIR.to_owned(),
        root.path().join("run").display().to_string(),
    );
    let writer = CheckpointWriter::from_env(&env).unwrap().unwrap();
    assert_eq!(writer.folder().name(), "run");
    assert_eq!(writer.attempt(), None, "no attempt: it writes in place");
    env.insert(CHECKPOINT_ATTEMPT.to_owned(), "3".to_owned());
    let staging = CheckpointWriter::from_env(&env).unwrap().unwrap();
    assert_eq!(staging.attempt(), Some(3));
    assert!(matches!(
        writer.hand_in(1, None, &file).await,
        HandIn::Failed { index: 1, error } if error.contains("must be a directory")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_a_checkpoint_fails_the_hand_in_naming_it_instead_of_hanging() {
    let root = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    write_file(&source.path().join("model.pt"), 10, 0);
    let fifo = source.path().join("shard/pipe");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let writer = CheckpointWriter::new(storage(root.path()).run("run"));
    let handed = tokio::time::timeout(
        Duration::from_secs(20),
        writer.hand_in(1, None, source.path()),
    );
    let Ok(hand_in) = handed.await else {
        // Unblock the copy that waits for a writer, so that the test ends.
        drop(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&fifo),
        );
        panic!("the hand-in hangs on a FIFO");
    };
    match hand_in {
        HandIn::Failed { index: 1, error } => assert!(
            error.contains(&fifo.display().to_string()) && error.contains("is a FIFO"),
            "{error}"
        ),
        other => panic!("expected a failed hand-in, got {other:?}"),
    }
    assert!(
        files_under(&root.path().join("run")).is_empty(),
        "nothing is left under a final name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_in_a_checkpoint_is_refused_and_what_it_points_to_is_not_copied() {
    let root = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("id_rsa"), "secret").unwrap();
    write_file(&source.path().join("model.pt"), 10, 0);
    std::os::unix::fs::symlink(secret.path().join("id_rsa"), source.path().join("key")).unwrap();
    let folder = storage(root.path()).run("run");
    let error = folder
        .persist_directory(1, source.path())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StorageError::NotARegularFile { path, kind: "a symbolic link" }
            if *path == source.path().join("key").display().to_string()),
        "{error:?}"
    );
    // The log folders of an attempt are uploaded through the same walk.
    let error = folder
        .upload_directory("logs/attempt_0", source.path())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StorageError::NotARegularFile { .. }),
        "{error:?}"
    );
    assert!(files_under(&root.path().join("run")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_in_beyond_the_tasks_bounds_on_files_or_bytes_fails_naming_the_bound() {
    let root = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    for (i, name) in ["a.pt", "b.pt", "c/d.pt"].iter().enumerate() {
        write_file(&source.path().join(name), 10, i as u8);
    }
    let writer = |files: &str, bytes: &str| {
        let env = BTreeMap::from([
            (
                RUN_DIR.to_owned(),
                root.path().join("run").display().to_string(),
            ),
            (CHECKPOINT_MAX_FILES.to_owned(), files.to_owned()),
            (CHECKPOINT_MAX_BYTES.to_owned(), bytes.to_owned()),
        ]);
        CheckpointWriter::from_env(&env).unwrap().unwrap()
    };
    match writer("2", "").hand_in(1, None, source.path()).await {
        HandIn::Failed { error, .. } => {
            assert!(error.contains("more than 2 files"), "{error}");
        }
        other => panic!("expected a failed hand-in, got {other:?}"),
    }
    match writer("", "25").hand_in(1, None, source.path()).await {
        HandIn::Failed { error, .. } => {
            assert!(
                error.contains("at least 30 bytes, more than the 25"),
                "{error}"
            );
        }
        other => panic!("expected a failed hand-in, got {other:?}"),
    }
    assert!(
        files_under(&root.path().join("run")).is_empty(),
        "nothing copied"
    );
    assert!(matches!(
        writer("3", "30").hand_in(1, None, source.path()).await,
        HandIn::Persisted { bytes: 30, .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_uncommitted_removes_later_checkpoints_and_temporary_files_only() {
    let root = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    write_file(&source.path().join("sub/model.pt"), 1000, 0);
    let folder = storage(root.path()).run("run");
    for index in 1..=4 {
        folder
            .persist_directory(index, source.path())
            .await
            .unwrap();
    }
    folder.save(&RunRecord::new("run")).await.unwrap();
    let run = root.path().join("run");
    let temps = [
        run.join(".run.json.part-0123456789abcdef"),
        run.join("checkpoint_000001/sub/.model.pt.part-fedcba9876543210"),
    ];
    for temp in &temps {
        write_file(temp, 10, 0);
    }
    write_file(&run.join("notes/.keep"), 1, 0);

    assert_eq!(folder.delete_uncommitted(2).await.unwrap(), [3, 4]);

    assert_eq!(
        files_under(&run),
        [
            "checkpoint_000001/sub/model.pt",
            "checkpoint_000002/sub/model.pt",
            "notes/.keep",
            "run.json"
        ]
    );
    assert!(folder.delete_uncommitted(2).await.unwrap().is_empty());
    // A run folder that does not exist yet has nothing to delete.
    assert!(
        storage(root.path())
            .run("other")
            .delete_uncommitted(0)
            .await
            .unwrap()
            .is_empty()
    );
    folder
        .delete_checkpoint(&checkpoint_dir_name(1))
        .await
        .unwrap();
    assert!(!run.join("checkpoint_000001").exists());
    // Deleting what is gone is no error.
    folder
        .delete_checkpoint(&checkpoint_dir_name(1))
        .await
        .unwrap();
}

fn record(name: &str, checkpoints: u64) -> RunRecord {
    let mut record = RunRecord::new(name);
    for index in 1..=checkpoints {
        let mut metrics = serde_json::Map::new();
        metrics.insert("loss".into(), (1.0 / index as f64).into());
        record.commit(CheckpointRecord {
            index,
            attempt: 0,
            dir: checkpoint_dir_name(index),
            metrics,
            files: (0..8).map(|r| format!("rank_{r}/model_shard.pt")).collect(),
            bytes: 1 << 30,
            committed_at: 1.0,
        });
    }
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_json_is_replaced_atomically_so_a_concurrent_reader_never_sees_a_part() {
    let root = tempfile::tempdir().unwrap();
    let store = storage(root.path());
    let folder = store.run("run");
    assert!(folder.load().await.unwrap().is_none());
    assert!(!store.has_run("run").await.unwrap());
    // Two records of different sizes (the larger about 1 MB), written in turn.
    let (small, large) = (record("run", 1), record("run", 2000));
    folder.save(&small).await.unwrap();
    assert!(store.has_run("run").await.unwrap());
    let path = root.path().join("run/run.json");
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (done, path, small, large) = (
            Arc::clone(&done),
            path.clone(),
            small.clone(),
            large.clone(),
        );
        std::thread::spawn(move || {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) {
                let bytes = std::fs::read(&path).unwrap();
                let seen: RunRecord = serde_json::from_slice(&bytes).expect("a whole record");
                // (Compared by size: floats need not round-trip exactly through JSON.)
                let count = seen.checkpoints.len();
                assert!(count == small.checkpoints.len() || count == large.checkpoints.len());
                reads += 1;
            }
            reads
        })
    };
    for i in 0..40 {
        folder
            .save(if i % 2 == 0 { &large } else { &small })
            .await
            .unwrap();
    }
    done.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(
        folder.load().await.unwrap().map(|r| r.checkpoints.len()),
        Some(1)
    );
    assert_eq!(files_under(&root.path().join("run")), ["run.json"]);

    std::fs::write(&path, b"{ not json").unwrap();
    let error = folder.load().await.unwrap_err();
    assert!(
        matches!(&error, StorageError::BadRecord { path: p, .. } if *p == path.display().to_string()),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_vanished_before_a_restore_is_an_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    write_file(&source.path().join("a.pt"), 10, 0);
    write_file(&source.path().join("b.pt"), 10, 0);
    let folder = storage(root.path()).run("run");
    folder.persist_directory(5, source.path()).await.unwrap();
    let files = vec!["a.pt".to_owned(), "b.pt".to_owned()];
    let dir = root.path().join("run/checkpoint_000005");

    std::fs::remove_file(dir.join("b.pt")).unwrap();
    match folder
        .verify_checkpoint(&checkpoint_dir_name(5), &files)
        .await
    {
        Err(StorageError::CheckpointMissing { path, file }) => {
            assert_eq!((path, file.as_str()), (dir.display().to_string(), "b.pt"));
        }
        other => panic!("{other:?}"),
    }

    std::fs::remove_dir_all(&dir).unwrap();
    let error = folder
        .verify_checkpoint(&checkpoint_dir_name(5), &files)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains(&dir.display().to_string()),
        "{error}"
    );
    assert!(matches!(
        folder
            .download_checkpoint(&checkpoint_dir_name(5), root.path())
            .await,
        Err(StorageError::CheckpointMissing { .. })
    ));
    // A task told to resume from it fails before it starts, naming it.
    let mut env = BTreeMap::from([(CHECKPOINT_URI.to_owned(), folder.checkpoint_uri(5))]);
    let error = prepare_task_env(&mut env, root.path()).await.unwrap_err();
    assert!(error.to_string().contains("checkpoint_000005"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_resuming_from_a_local_checkpoint_reads_it_in_place() {
    let root = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    write_file(&source.path().join("a.pt"), 10, 0);
    let folder = storage(root.path()).run("run");
    folder.persist_directory(2, source.path()).await.unwrap();

    let mut env = BTreeMap::from([(CHECKPOINT_URI.to_owned(), folder.checkpoint_uri(2))]);
    prepare_task_env(&mut env, Path::new("/nonexistent"))
        .await
        .unwrap();
    assert_eq!(
        env.get(CHECKPOINT).map(String::as_str),
        Some(root.path().join("run/checkpoint_000002").to_str().unwrap())
    );
    // Without a checkpoint to resume from, nothing changes.
    let mut env = BTreeMap::new();
    prepare_task_env(&mut env, Path::new("/nonexistent"))
        .await
        .unwrap();
    assert!(env.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_folder_opens_from_its_uri() {
    let folder = RunFolder::open_uri("/srv/runs/mnist", &BTreeMap::new()).unwrap();
    assert_eq!(folder.name(), "mnist");
    assert_eq!(folder.uri(), "/srv/runs/mnist");
    assert_eq!(
        folder.checkpoint_uri(12),
        "/srv/runs/mnist/checkpoint_000012"
    );
    let folder = RunFolder::open_uri("s3://bucket/p/mnist", &BTreeMap::new()).unwrap();
    assert_eq!(folder.name(), "mnist");
    assert_eq!(
        folder.checkpoint_uri(1),
        "s3://bucket/p/mnist/checkpoint_000001"
    );
    assert_eq!(folder.dir_local_path(&checkpoint_dir_name(1)), None);
    for uri in ["s3://bucket", "/", "gs://b/x"] {
        assert!(
            matches!(
                RunFolder::open_uri(uri, &BTreeMap::new()),
                Err(StorageError::InvalidLocation { .. })
            ),
            "{uri}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_storage_fails_the_check_naming_the_path_and_the_error() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("a-file");
    write_file(&file, 1, 0);
    // Root ignores permission bits; a folder below a regular file cannot be made by anyone.
    let location = file.join("runs");
    let error = storage(&location).check_writable().await.unwrap_err();
    let text = trainyard_config::resources::ErrorChain(&error).to_string();
    assert!(text.contains(&location.display().to_string()), "{text}");
    assert!(text.contains("Not a directory"), "{text}");

    // A folder that does not exist yet is made.
    let fresh = root.path().join("new/runs");
    storage(&fresh).check_writable().await.unwrap();
    assert!(fresh.is_dir());
    assert!(files_under(&fresh).is_empty(), "the probe is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_endpoint_where_nothing_listens_fails_the_check_in_seconds() {
    // A loopback port that nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = BTreeMap::from(
        [
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let location: StorageLocation = "s3://bucket/runs".parse().unwrap();
    let storage = Storage::open(location, &env).unwrap();
    let started = std::time::Instant::now();
    let error = tokio::time::timeout(Duration::from_secs(60), storage.check_writable())
        .await
        .expect("the check gives up by itself")
        .unwrap_err();
    let elapsed = started.elapsed();
    let text = trainyard_config::resources::ErrorChain(&error).to_string();
    assert!(
        elapsed < Duration::from_secs(15),
        "took {elapsed:?}: {text}"
    );
    assert!(
        text.contains("s3://bucket/runs/.trainyard-write-check-"),
        "{text}"
    );
    eprintln!("failed after {elapsed:?}: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_is_uploaded_under_any_path_of_the_run_folder() {
    let root = tempfile::tempdir().unwrap();
    let folder = storage(root.path()).run("logged");
    assert_eq!(folder.local_path(), Some(root.path().join("logged")));
    let logs = tempfile::tempdir().unwrap();
    write_file(&logs.path().join("rank_0.log"), 300, 1);
    write_file(&logs.path().join("stacks/dump.txt"), 50, 2);
    let bytes = folder
        .upload_directory("logs/attempt_3", logs.path())
        .await
        .unwrap();
    assert_eq!(bytes, 350);
    let uploaded = root.path().join("logged/logs/attempt_3");
    assert_eq!(files_under(&uploaded), ["rank_0.log", "stacks/dump.txt"]);
    assert_eq!(
        std::fs::read(uploaded.join("rank_0.log")).unwrap(),
        std::fs::read(logs.path().join("rank_0.log")).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_written_into_the_run_folder_is_registered_where_it_is_and_nothing_else_is() {
    let root = tempfile::tempdir().unwrap();
    let folder = storage(root.path()).run("mnist");
    let run = root.path().join("mnist");
    write_file(&run.join("dcp/step_3/__0_0.distcp"), 100, 1);
    write_file(&run.join("dcp/step_3/.metadata"), 10, 2);
    write_file(&run.join("dcp/step_3/__1_0.distcp"), 100, 3);
    // Every rank's files are in the folder: one rank's bounds do not apply.
    let writer = CheckpointWriter::new(folder.clone()).with_limits(HandInLimits {
        files: Some(1),
        bytes: Some(1),
    });

    let registered = writer
        .register(3, &run.join("dcp/./step_3/").display().to_string())
        .await
        .unwrap();
    assert_eq!(
        registered,
        HandIn::InStorage {
            index: 3,
            dir: "dcp/step_3".into(),
            files: vec![
                ".metadata".into(),
                "__0_0.distcp".into(),
                "__1_0.distcp".into()
            ],
            bytes: 210,
        }
    );
    assert_eq!(
        folder.dir_local_path("dcp/step_3"),
        Some(run.join("dcp/step_3"))
    );
    folder
        .verify_checkpoint("dcp/step_3", &[".metadata".into()])
        .await
        .unwrap();

    let outside = tempfile::tempdir().unwrap();
    write_file(&outside.path().join("model.pt"), 5, 4);
    write_file(&root.path().join("mnist2/step_3/model.pt"), 5, 5);
    write_file(&run.join("logs/attempt_0/rank_0.log"), 5, 6);
    write_file(&run.join("checkpoint_000003/model.pt"), 5, 7);
    // A link inside the run folder that leads out of it: num_to_keep would delete there.
    std::os::unix::fs::symlink(outside.path(), run.join("linked")).unwrap();
    std::fs::create_dir_all(run.join("empty")).unwrap();
    let refusals = [
        (outside.path().display().to_string(), "it is not below it"),
        (
            root.path().join("mnist2/step_3").display().to_string(),
            "it is not below it",
        ),
        (
            run.join("../mnist2/step_3").display().to_string(),
            "it is not below it",
        ),
        (
            run.join("linked").display().to_string(),
            "it is not below it",
        ),
        (run.display().to_string(), "it is not below it"),
        (
            "mnist/dcp/step_3".to_owned(),
            "neither an absolute path nor a URI",
        ),
        (
            run.join("logs/attempt_0").display().to_string(),
            "`logs` is trainyard's own",
        ),
        (
            run.join("checkpoint_000003").display().to_string(),
            "`checkpoint_000003` is trainyard's own",
        ),
        (
            run.join("absent").display().to_string(),
            "it does not exist",
        ),
        (run.join("empty").display().to_string(), "it holds no files"),
    ];
    for (path, reason) in refusals {
        let error = writer.register(3, &path).await.unwrap_err();
        assert!(
            matches!(&error, StorageError::NotInRunFolder { reason: r, .. } if r.contains(reason)),
            "{path}: {error}"
        );
        assert!(error.to_string().contains("NO_UPLOAD"), "{error}");
    }
    // A record naming a folder outside the run folder is neither read nor deleted.
    for dir in ["", "..", "../mnist2", "/tmp"] {
        assert!(
            matches!(
                folder.delete_checkpoint(dir).await,
                Err(StorageError::NotACheckpointFolder { .. })
            ),
            "{dir:?}"
        );
    }
    assert!(root.path().join("mnist2/step_3/model.pt").is_file());
}

#[tokio::test]
async fn delete_uncommitted_spares_the_lease_the_driver_is_writing() {
    let root = tempfile::tempdir().unwrap();
    let folder = storage(root.path()).run("run");
    folder.save(&RunRecord::new("run")).await.unwrap();
    let run = root.path().join("run");
    // The driver renews its lease through a temporary name while an attempt starts.
    let lease = run.join(".lease.json.part-0123456789abcdef");
    write_file(&lease, 10, 0);
    write_file(&run.join(".run.json.part-fedcba9876543210"), 10, 0);

    assert!(folder.delete_uncommitted(0).await.unwrap().is_empty());

    assert!(lease.exists(), "the lease's temporary file is spared");
    assert_eq!(
        files_under(&run),
        [".lease.json.part-0123456789abcdef", "run.json"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_checkpoint_taken_whole_is_moved_into_the_run_folder_and_a_kept_one_copied() {
    use std::os::unix::fs::MetadataExt as _;
    let root = tempfile::tempdir().unwrap();
    let ranks = tempfile::tempdir().unwrap();
    let writer = CheckpointWriter::new(storage(root.path()).run("run"));
    let inode = |path: &Path| std::fs::metadata(path).unwrap().ino();

    // Deleted after the hand-in (the default): the agent's alone, so renamed into place.
    let given = ranks.path().join("given");
    write_file(&given.join("model.pt"), 4096, 1);
    write_file(&given.join("optim/state.pt"), 100, 2);
    let before = inode(&given.join("model.pt"));
    let taken = writer.take(&given, true).await.unwrap();
    let hand_in = writer.hand_in_taken(1, None, &taken).await;
    taken.remove().await;
    assert!(
        matches!(&hand_in, HandIn::Persisted { bytes: 4196, files, .. } if files == &["model.pt", "optim/state.pt"]),
        "{hand_in:?}"
    );
    let persisted = root.path().join("run").join(checkpoint_dir_name(1));
    assert_eq!(
        inode(&persisted.join("model.pt")),
        before,
        "moved, not copied"
    );
    let mode = std::fs::metadata(persisted.join("model.pt"))
        .unwrap()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644, "as a copied file's");

    // Kept (linked into staging): still the rank's file too, so copied, and the rank writing
    // it in place afterwards does not change the checkpoint.
    let kept = ranks.path().join("kept");
    write_file(&kept.join("model.pt"), 4096, 3);
    let taken = writer.take(&kept, false).await.unwrap();
    let hand_in = writer.hand_in_taken(2, None, &taken).await;
    taken.remove().await;
    assert!(matches!(hand_in, HandIn::Persisted { .. }), "{hand_in:?}");
    let persisted = root.path().join("run").join(checkpoint_dir_name(2));
    assert_ne!(
        inode(&persisted.join("model.pt")),
        inode(&kept.join("model.pt"))
    );
    std::fs::write(kept.join("model.pt"), b"changed in place").unwrap();
    assert_eq!(
        std::fs::read(persisted.join("model.pt")).unwrap().len(),
        4096
    );

    // A file with a second link elsewhere could change after the commit: copied.
    let linked = ranks.path().join("linked");
    write_file(&linked.join("model.pt"), 64, 4);
    std::fs::hard_link(linked.join("model.pt"), ranks.path().join("elsewhere.pt")).unwrap();
    let taken = writer.take(&linked, true).await.unwrap();
    let hand_in = writer.hand_in_taken(3, None, &taken).await;
    taken.remove().await;
    assert!(matches!(hand_in, HandIn::Persisted { .. }), "{hand_in:?}");
    let persisted = root.path().join("run").join(checkpoint_dir_name(3));
    assert_ne!(
        inode(&persisted.join("model.pt")),
        inode(&ranks.path().join("elsewhere.pt"))
    );
}
