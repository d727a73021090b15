//! Run folders in S3, against a real S3 API server (moto, through `testing::S3Server`).
//! Without moto installed these tests print a `SKIP:` line and pass, unless `CI=true`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use trainyard_checkpoint::testing::S3Server;
use trainyard_checkpoint::{
    CHECKPOINT, CHECKPOINT_URI, CheckpointWriter, HandIn, RUN_DIR, RunFolder, RunRecord, Storage,
    StorageError, StorageLocation, checkpoint_dir_name, prepare_task_env,
};

fn write_file(path: &Path, len: usize, seed: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect();
    std::fs::write(path, data).unwrap();
}

/// The server with a bucket `runs`; `None` when moto is not installed (outside CI).
fn server() -> Option<S3Server> {
    let server = S3Server::start().expect("moto starts")?;
    server.create_bucket("runs").expect("the bucket is created");
    Some(server)
}

/// The writer of a task whose run folder is `folder`, in the storage `env` reaches.
fn task_writer(folder: &RunFolder, env: &BTreeMap<String, String>) -> CheckpointWriter {
    let mut task_env = env.clone();
    task_env.insert(RUN_DIR.to_owned(), folder.uri());
    CheckpointWriter::from_env(&task_env).unwrap().unwrap()
}

fn assert_same_files(a: &Path, b: &Path, names: &[&str]) {
    for name in names {
        assert_eq!(
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_run_folder_keeps_two_ranks_checkpoints_its_record_and_restores_them() {
    let Some(server) = server() else { return };
    let env = server.env();
    let location: StorageLocation = "s3://runs/team/exp".parse().unwrap();
    let storage = Storage::open(location, &env).unwrap();
    storage.check_writable().await.unwrap();
    assert!(!storage.has_run("mnist").await.unwrap());
    let folder = storage.run("mnist");
    assert_eq!(folder.uri(), "s3://runs/team/exp/mnist");
    assert!(folder.load().await.unwrap().is_none());

    // Rank 0 hands in a file large enough to go in parts, rank 1 a shard; at once.
    let (rank0, rank1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_file(&rank0.path().join("model.pt"), 20 << 20, 1);
    write_file(&rank0.path().join("meta/config.json"), 100, 2);
    write_file(&rank1.path().join("shard_1.pt"), (1 << 20) + 3, 3);
    let writer = task_writer(&folder, &env);
    let (a, b) = tokio::join!(
        writer.persist(1, rank0.path()),
        writer.persist(1, rank1.path())
    );
    assert_eq!(
        a.unwrap(),
        HandIn::Persisted {
            index: 1,
            dir: None,
            files: vec!["meta/config.json".into(), "model.pt".into()],
            bytes: (20 << 20) + 100
        }
    );
    assert_eq!(
        b.unwrap(),
        HandIn::Persisted {
            index: 1,
            dir: None,
            files: vec!["shard_1.pt".into()],
            bytes: (1 << 20) + 3
        }
    );
    let files: Vec<String> = ["meta/config.json", "model.pt", "shard_1.pt"]
        .map(String::from)
        .into();
    folder
        .verify_checkpoint(&checkpoint_dir_name(1), &files)
        .await
        .unwrap();

    // run.json
    let mut record = RunRecord::new("mnist");
    record.last_index = 1;
    folder.save(&record).await.unwrap();
    assert_eq!(folder.load().await.unwrap(), Some(record));
    assert!(storage.has_run("mnist").await.unwrap());

    // Checkpoints 2 and 3 were handed in but never committed.
    for index in [2, 3] {
        folder.persist_directory(index, rank1.path()).await.unwrap();
    }
    assert_eq!(folder.delete_uncommitted(1).await.unwrap(), [2, 3]);
    assert!(folder.delete_uncommitted(1).await.unwrap().is_empty());
    assert!(folder.load().await.unwrap().is_some(), "run.json is kept");
    folder
        .verify_checkpoint(&checkpoint_dir_name(1), &files)
        .await
        .unwrap();

    // Restores: into a given folder, and for a task, into a fresh one under its scratch.
    let dest = tempfile::tempdir().unwrap();
    let restored = folder
        .download_checkpoint(&checkpoint_dir_name(1), &dest.path().join("ckpt"))
        .await
        .unwrap();
    assert_same_files(&restored, rank0.path(), &["model.pt", "meta/config.json"]);
    assert_same_files(&restored, rank1.path(), &["shard_1.pt"]);
    let scratch = tempfile::tempdir().unwrap();
    let mut task_env = env.clone();
    task_env.insert(CHECKPOINT_URI.to_owned(), folder.checkpoint_uri(1));
    prepare_task_env(&mut task_env, scratch.path())
        .await
        .unwrap();
    let local = Path::new(task_env.get(CHECKPOINT).expect("the task is told where")).to_path_buf();
    assert!(local.starts_with(scratch.path()), "{}", local.display());
    assert_same_files(&local, rank0.path(), &["model.pt", "meta/config.json"]);
    assert_same_files(&local, rank1.path(), &["shard_1.pt"]);

    // Once deleted, a restore is an error naming the checkpoint.
    folder
        .delete_checkpoint(&checkpoint_dir_name(1))
        .await
        .unwrap();
    let uri = "s3://runs/team/exp/mnist/checkpoint_000001";
    match folder
        .verify_checkpoint(&checkpoint_dir_name(1), &files)
        .await
    {
        Err(StorageError::CheckpointMissing { path, file }) => {
            assert_eq!((path.as_str(), file.as_str()), (uri, "meta/config.json"));
        }
        other => panic!("{other:?}"),
    }
    let error = folder
        .download_checkpoint(&checkpoint_dir_name(1), dest.path())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StorageError::CheckpointMissing { path, .. } if path == uri),
        "{error:?}"
    );
    let scratch = tempfile::tempdir().unwrap();
    let mut task_env = env.clone();
    task_env.insert(CHECKPOINT_URI.to_owned(), uri.to_owned());
    let error = prepare_task_env(&mut task_env, scratch.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains(uri), "{error}");
    assert!(!task_env.contains_key(CHECKPOINT));
    assert_eq!(
        std::fs::read_dir(scratch.path()).unwrap().count(),
        0,
        "nothing is left in scratch"
    );
}

/// What `trainyard ps` reads: one listing names the run folders under the prefix (not those
/// of another prefix), and each one's record loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_folders_under_an_s3_prefix_are_listed_and_their_records_load() {
    let Some(server) = server() else { return };
    let env = server.env();
    let storage = Storage::open("s3://runs/listed".parse().unwrap(), &env).unwrap();
    assert!(storage.run_names().await.unwrap().is_empty());
    for name in ["b-run", "a-run"] {
        storage.run(name).save(&RunRecord::new(name)).await.unwrap();
    }
    let elsewhere = Storage::open("s3://runs/other".parse().unwrap(), &env).unwrap();
    elsewhere
        .run("c-run")
        .save(&RunRecord::new("c-run"))
        .await
        .unwrap();
    let names = storage.run_names().await.unwrap();
    assert_eq!(names, ["a-run", "b-run"]);
    for name in names {
        let record = storage.run(&name).load().await.unwrap().expect("a record");
        assert_eq!(record.name, name);
    }
    // The metrics history: S3 cannot append, so the whole history goes each time.
    let run = storage.run("a-run");
    assert!(run.read_metrics().await.unwrap().is_empty());
    assert!(run.metrics_tail(64).await.unwrap().is_empty());
    run.write_metrics(b"{\"n\":1}\n", b"{\"n\":1}\n")
        .await
        .unwrap();
    run.write_metrics(b"{\"n\":2}\n", b"{\"n\":1}\n{\"n\":2}\n")
        .await
        .unwrap();
    assert_eq!(run.read_metrics().await.unwrap(), b"{\"n\":1}\n{\"n\":2}\n");
    assert_eq!(run.metrics_tail(8).await.unwrap(), b"{\"n\":2}\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_uploaded_into_an_s3_run_folder_reads_back_the_same() {
    let Some(server) = server() else { return };
    let location: StorageLocation = "s3://runs/logs-test".parse().unwrap();
    let folder = Storage::open(location, &server.env())
        .unwrap()
        .run("logged");
    assert_eq!(folder.local_path(), None);
    let logs = tempfile::tempdir().unwrap();
    write_file(&logs.path().join("rank_0.log"), 300, 1);
    write_file(&logs.path().join("rank_1.log"), 40, 2);
    // Under a checkpoint's name, so that the crate's own restore reads it back.
    let bytes = folder
        .upload_directory("checkpoint_000007", logs.path())
        .await
        .unwrap();
    assert_eq!(bytes, 340);
    let back = tempfile::tempdir().unwrap();
    let restored = folder
        .download_checkpoint(&checkpoint_dir_name(7), &back.path().join("logs"))
        .await
        .unwrap();
    assert_same_files(&restored, logs.path(), &["rank_0.log", "rank_1.log"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_does_not_exist_fails_the_check_and_the_persist_naming_it() {
    let Some(server) = server() else { return };
    let location: StorageLocation = "s3://no-such-bucket/x".parse().unwrap();
    let storage = Storage::open(location, &server.env()).unwrap();
    let error = storage.check_writable().await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("s3://no-such-bucket/x/.trainyard-write-check-"),
        "{error}"
    );
    let source = tempfile::tempdir().unwrap();
    write_file(&source.path().join("model.pt"), 10, 0);
    let writer = CheckpointWriter::new(storage.run("run"));
    match writer.hand_in(4, None, source.path()).await {
        HandIn::Failed { index: 4, error } => {
            assert!(
                error.contains("s3://no-such-bucket/x/run/checkpoint_000004/model.pt"),
                "{error}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_server_and_its_process_group_are_gone_once_it_is_dropped() {
    let Some(server) = S3Server::start().unwrap() else {
        return;
    };
    let pid = server.pid();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let env: BTreeMap<_, _> = server.env();
    assert_eq!(env.get("AWS_ENDPOINT_URL"), Some(&server.endpoint()));
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_written_into_an_s3_run_folder_is_registered_where_it_is() {
    let Some(server) = server() else { return };
    let env = server.env();
    let storage = Storage::open("s3://runs/exp".parse().unwrap(), &env).unwrap();
    storage.check_writable().await.unwrap();
    let folder = storage.run("dcp");
    let shards = tempfile::tempdir().unwrap();
    write_file(&shards.path().join("__0_0.distcp"), 300, 1);
    write_file(&shards.path().join(".metadata"), 20, 2);
    // What torch's distributed checkpoint writes into storage itself.
    folder
        .upload_directory("step_1", shards.path())
        .await
        .unwrap();
    let writer = task_writer(&folder, &env);

    let uri = folder.dir_uri("step_1");
    assert_eq!(uri, "s3://runs/exp/dcp/step_1");
    assert_eq!(
        writer.register(1, &uri).await.unwrap(),
        HandIn::InStorage {
            index: 1,
            dir: "step_1".into(),
            files: vec![".metadata".into(), "__0_0.distcp".into()],
            bytes: 320,
        }
    );
    for elsewhere in [
        "s3://other/exp/dcp/step_1",
        "s3://runs/exp/dcp2/step_1",
        "/tmp/step_1",
    ] {
        let error = writer.register(1, elsewhere).await.unwrap_err();
        assert!(
            matches!(error, StorageError::NotInRunFolder { .. }),
            "{elsewhere}: {error}"
        );
    }
    let error = writer
        .register(2, &folder.dir_uri("step_2"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StorageError::NotInRunFolder { reason, .. } if reason.contains("no files")),
        "{error}"
    );
    let back = tempfile::tempdir().unwrap();
    let restored = folder
        .download_checkpoint("step_1", &back.path().join("step_1"))
        .await
        .unwrap();
    assert_same_files(&restored, shards.path(), &["__0_0.distcp", ".metadata"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_cut_off_mid_way_is_aborted_when_the_next_attempt_starts() {
    let Some(server) = server() else { return };
    let env = server.env();
    let storage = Storage::open("s3://runs/cut".parse().unwrap(), &env).unwrap();
    storage.check_writable().await.unwrap();
    let folder = storage.run("mnist");
    let writer = task_writer(&folder, &env);
    let shard = tempfile::tempdir().unwrap();
    // A name S3 keys hold escaped: the record names the key as it is.
    write_file(&shard.path().join("model~1.pt"), 40 << 20, 1);
    let open = || server.open_uploads("runs").unwrap();
    let records = || server.keys("runs", "cut/mnist/.uploads/").unwrap();

    // A whole upload in parts leaves neither an open upload nor its record.
    writer.persist(1, shard.path()).await.unwrap();
    assert_eq!((open(), records()), (vec![], vec![]));

    // The agent is killed mid-upload: the upload stays open, recorded.
    let upload = tokio::spawn({
        let (writer, dir) = (writer.clone(), shard.path().to_path_buf());
        async move { writer.persist(2, &dir).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while records().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no upload was recorded"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    upload.abort();
    assert!(upload.await.unwrap_err().is_cancelled());
    assert_eq!(open(), ["cut/mnist/checkpoint_000002/model%7E1.pt"]);
    assert_eq!(records().len(), 1);

    // The next attempt starts: checkpoint 1 is the last committed one.
    assert_eq!(
        folder.delete_uncommitted(1).await.unwrap(),
        Vec::<u64>::new()
    );
    assert_eq!((open(), records()), (vec![], vec![]));
}
