//! The storage conformance suite (`testing::conformance`) against each kind of storage: a
//! local folder, and S3 through a real S3 API server (moto, `testing::S3Server`) under a
//! prefix and at a bucket's root. Without moto installed the S3 test prints a `SKIP:` line
//! and passes, unless `CI=true`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;

use trainyard_checkpoint::testing::{S3Server, conformance};
use trainyard_checkpoint::{Storage, StorageLocation};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_storage_passes_the_conformance_suite() {
    let root = tempfile::tempdir().unwrap();
    let location = StorageLocation::Local(root.path().join("runs"));
    let storage = Storage::open(location, &BTreeMap::new()).unwrap();
    conformance::run_all(&storage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_storage_passes_the_conformance_suite_under_a_prefix_and_at_a_bucket_s_root() {
    let Some(server) = S3Server::start().expect("moto starts") else {
        return;
    };
    for (bucket, uri) in [("runs", "s3://runs/team/exp"), ("root", "s3://root")] {
        server.create_bucket(bucket).expect("the bucket is created");
        let location: StorageLocation = uri.parse().unwrap();
        let storage = Storage::open(location, &server.env()).unwrap();
        conformance::run_all(&storage).await;
    }
}
