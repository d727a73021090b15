//! `run.json`'s format: older records still load, newer ones are refused by their version.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;

use trainyard_checkpoint::{
    RUN_RECORD_VERSION, RunRecord, RunStatus, Storage, StorageError, StorageLocation,
};

fn folder_with(root: &std::path::Path, text: &str) -> trainyard_checkpoint::RunFolder {
    let storage =
        Storage::open(StorageLocation::Local(root.to_path_buf()), &BTreeMap::new()).unwrap();
    std::fs::create_dir_all(root.join("run")).unwrap();
    std::fs::write(root.join("run/run.json"), text).unwrap();
    storage.run("run")
}

#[tokio::test]
async fn a_record_of_format_1_loads_without_a_driver() {
    let dir = tempfile::tempdir().unwrap();
    let folder = folder_with(
        dir.path(),
        r#"{"version": 1, "name": "run", "status": "failed", "attempts": []}"#,
    );
    let record = folder.load().await.unwrap().expect("a record");
    assert_eq!(record.version, 1);
    assert_eq!(record.status, RunStatus::Failed);
    assert!(record.driver.is_none());
}

#[tokio::test]
async fn interrupted_and_stopped_runs_can_be_resumed() {
    let dir = tempfile::tempdir().unwrap();
    for status in ["interrupted", "stopped"] {
        let folder = folder_with(
            dir.path(),
            &format!(r#"{{"version": 2, "name": "run", "status": "{status}"}}"#),
        );
        let record = folder.load().await.unwrap().expect("a record");
        assert!(record.status.is_resumable(), "{status}");
    }
    assert_eq!(RunRecord::new("x").version, RUN_RECORD_VERSION);
}

#[tokio::test]
async fn a_record_of_a_newer_format_is_refused_by_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let folder = folder_with(
        dir.path(),
        r#"{"version": 4, "name": "run", "status": "paused", "lease": {}}"#,
    );
    let error = folder.load().await.unwrap_err();
    assert!(
        matches!(error, StorageError::NewerRecord { version: 4, .. }),
        "{error:?}"
    );
    let said = error.to_string();
    assert!(
        said.contains("format 4, written by a newer trainyard; this one reads formats 1 to 3"),
        "{said}"
    );
}

#[test]
fn a_checkpoint_folder_inside_or_around_a_kept_ones_is_found() {
    let mut record = RunRecord::new("run");
    for (index, dir) in [(1, "dcp"), (2, "steps/2")] {
        record.commit(trainyard_checkpoint::CheckpointRecord {
            index,
            attempt: 0,
            dir: dir.to_owned(),
            metrics: serde_json::Map::new(),
            files: vec!["a".to_owned()],
            bytes: 1,
            committed_at: 0.0,
        });
    }
    assert_eq!(record.nested_with("dcp/step_3").map(|c| c.index), Some(1));
    assert_eq!(record.nested_with("steps").map(|c| c.index), Some(2));
    for apart in ["dcp", "dcp2/x", "steps/20", "steps2"] {
        assert!(record.nested_with(apart).is_none(), "{apart}");
    }
    // The same folder written again replaces the record that named it.
    record.commit(trainyard_checkpoint::CheckpointRecord {
        index: 3,
        attempt: 0,
        dir: "dcp".to_owned(),
        metrics: serde_json::Map::new(),
        files: vec!["b".to_owned()],
        bytes: 1,
        committed_at: 0.0,
    });
    let kept: Vec<u64> = record.checkpoints.iter().map(|c| c.index).collect();
    assert_eq!(kept, [2, 3]);
}
