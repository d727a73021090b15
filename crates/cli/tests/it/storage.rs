//! The run's storage failing through `trainyard run`: an S3 endpoint where nothing listens is
//! refused before any worker starts, and a disk that fills while a rank's checkpoint is
//! copied fails that rank's `report` and commits nothing.

use trainyard_test_support::processes as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{MARKER, left_behind};
use trainyard_test_support::running::Running;

/// How long one run may take before the test kills it.
const RUN_LIMIT: Duration = Duration::from_secs(240);

fn trainyard(name: &str, storage: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .args(["run", "-n", "2", "--backend", "none", "--name", name])
        .args(["--storage", storage])
        .env(
            "TRAINYARD_LEDGER",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-{name}")),
        )
        .env("CI", "1")
        .env(MARKER, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Sends `signal` to the S3 server: `SIGSTOP` makes it stop answering, `SIGCONT` answer
/// again.
fn signal_server(
    server: &trainyard_checkpoint::testing::S3Server,
    signal: nix::sys::signal::Signal,
) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.pid()).expect("a pid"));
    nix::sys::signal::kill(pid, signal).expect("the storage server is signalled");
}

fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// How a rank's script starts when it resumes: a rank that finds a checkpoint says what it
/// holds and exits 0; else it writes its shard (`shard_<rank>`) into `d`, a new directory.
const RESUMED_OR_A_SHARD: &str = r#"
import os, sys, tempfile, time
from trainyard import train
rank = train.get_context().get_world_rank()
checkpoint = train.get_checkpoint()
if checkpoint is not None:
    with checkpoint.as_directory() as d:
        print(f"rank {rank} resumed with {sorted(os.listdir(d))}", flush=True)
    sys.exit(0)
d = tempfile.mkdtemp()
with open(os.path.join(d, f"shard_{rank}"), "w") as f:
    f.write(str(rank))
"#;

#[test]
fn an_unreachable_s3_endpoint_is_refused_before_any_worker_starts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let started = Instant::now();
    let output = trainyard("s3-unreachable", "s3://bucket/runs")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .args(["--", "sh", "-c", "echo started-$RANK"])
        .output()
        .expect("trainyard runs");
    let all = text(&output);
    assert_eq!(output.status.code(), Some(2), "{all}");
    assert!(
        all.contains("s3://bucket/runs"),
        "the error names the storage: {all}"
    );
    assert!(!all.contains("started-"), "no worker started: {all}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "refused in {:?}",
        started.elapsed()
    );
}

/// A 1 MiB tmpfs, unmounted when dropped; `None` (after saying why) where mounting is not
/// permitted.
struct SmallDisk {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
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
                    "SKIP: a full disk is a 1 MiB tmpfs, which cannot be mounted here: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(error) => {
                eprintln!("SKIP: a full disk is a 1 MiB tmpfs; `mount` cannot run: {error}");
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

#[test]
fn a_disk_that_fills_during_a_copy_fails_the_report_and_commits_nothing() {
    let Some(disk) = SmallDisk::mount() else {
        return;
    };
    let script = r#"
import os, sys, tempfile
from trainyard import train
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        f.write(os.urandom(2 * 1024 * 1024))
    try:
        train.report({"epoch": 1}, checkpoint=train.Checkpoint.from_directory(d))
    except train.ReportError as error:
        print(f"report failed: {error}", flush=True)
        sys.exit(7)
print("report returned", flush=True)
"#;
    let storage = disk.path.display().to_string();
    let output = trainyard("disk-full", &storage)
        .args(["--", "python3", "-c", script])
        .output()
        .expect("trainyard runs");
    let all = text(&output);
    assert_eq!(output.status.code(), Some(1), "the run fails: {all}");
    assert!(all.contains("report failed:"), "{all}");
    assert!(
        all.contains("No space left on device"),
        "the error says why: {all}"
    );
    assert!(!all.contains("report returned"), "{all}");
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(disk.path.join("disk-full/run.json")).expect("run.json"),
    )
    .expect("valid JSON");
    assert_eq!(record["checkpoints"], serde_json::json!([]), "{record}");
    assert_eq!(
        record["latest_checkpoint"],
        serde_json::Value::Null,
        "{record}"
    );
    assert!(left_behind("disk-full", Duration::from_secs(10)).is_empty());
}

#[test]
fn an_s3_error_shows_each_cause_once() {
    let Some(server) = trainyard_checkpoint::testing::S3Server::start().expect("moto starts")
    else {
        return;
    };
    let output = trainyard("s3-no-bucket", "s3://no-such-bucket/runs")
        .envs(server.env())
        .args(["--", "true"])
        .output()
        .expect("trainyard runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("error: the run cannot start: "),
        "{stderr}"
    );
    // The server's answer names the missing bucket; it is shown once, however many layers of
    // the error carry it.
    assert_eq!(errors[0].matches("NoSuchBucket").count(), 1, "{stderr}");
}

#[test]
fn a_slow_storage_makes_the_fourth_async_report_wait_and_every_checkpoint_commits() {
    let Some(server) = trainyard_checkpoint::testing::S3Server::start().expect("moto starts")
    else {
        return;
    };
    server.create_bucket("slow").expect("a bucket");
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let go = scratch.path().join("go");
    let script = r#"
import os, sys, tempfile, time
from trainyard import train
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
for step in range(4):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, f"step_{step}"), "w") as f:
        f.write(str(step))
    train.report({"step": step}, checkpoint=train.Checkpoint.from_directory(d),
                 checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
    print(f"returned {step}", flush=True)
"#;
    let mut run = Running::start(
        trainyard("slow-s3", "s3://slow/runs")
            .envs(server.env())
            .args(["--", "python3", "-c", script])
            .arg(&go),
    );
    let signal = |signal| signal_server(&server, signal);
    assert!(
        run.wait_for("ready", Duration::from_secs(60)).is_some(),
        "{}",
        run.stdout()
    );
    // The storage stops answering: two hand-ins are taken, not persisted, and a third waits
    // for room at the agent, on its way from the rank.
    signal(nix::sys::signal::Signal::SIGSTOP);
    std::fs::write(&go, b"").expect("the script is told to go");
    let three = run
        .wait_for("returned 2", Duration::from_secs(20))
        .is_some();
    let fourth_waited = three && run.wait_for("returned 3", Duration::from_secs(3)).is_none();
    signal(nix::sys::signal::Signal::SIGCONT);
    assert!(
        three,
        "three ASYNC reports return while the storage is stopped: {}",
        run.stdout()
    );
    assert!(fourth_waited, "the fourth waits for room: {}", run.stdout());
    assert!(
        run.wait_for("returned 3", Duration::from_secs(60))
            .is_some(),
        "and returns once the storage answers again: {}",
        run.stdout()
    );
    let ended = run.finish(RUN_LIMIT);
    let (status, all) = (ended.status, ended.all());
    assert!(status.success(), "{all}");
    assert!(
        all.contains("checkpoint committed: s3://slow/runs/slow-s3/checkpoint_000004"),
        "every checkpoint commits, the last too (sent as the program ends): {all}"
    );
    assert!(left_behind("slow-s3", Duration::from_secs(10)).is_empty());
}

#[test]
fn a_checkpoint_every_rank_handed_in_commits_though_a_rank_died_while_anothers_part_was_persisted()
{
    let Some(server) = trainyard_checkpoint::testing::S3Server::start().expect("moto starts")
    else {
        return;
    };
    server.create_bucket("survivors").expect("a bucket");
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let taken = scratch.path().join("taken");
    // Rank 0's part takes the server a while to take in; rank 1's is small, and rank 1 dies
    // once both parts are taken from their ranks: rank 0's is still on its way then.
    let script = r#"
import os, sys, tempfile, time
from trainyard import train
rank = train.get_context().get_world_rank()
checkpoint = train.get_checkpoint()
if checkpoint is not None:
    with checkpoint.as_directory() as d:
        parts = sorted((n, os.path.getsize(os.path.join(d, n))) for n in os.listdir(d))
    print(f"rank {rank} resumed with {parts}", flush=True)
    sys.exit(0)
d = tempfile.mkdtemp()
with open(os.path.join(d, f"shard_{rank}"), "wb") as f:
    f.write(b"x" * ((48 << 20) if rank == 0 else 1024))
train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(d),
             checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
if rank == 0:
    open(sys.argv[1], "w").close()
    time.sleep(120)
else:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.005)
    os._exit(3)
"#;
    let output = trainyard("survivor-s3", "s3://survivors/runs")
        .envs(server.env())
        .args(["--max-failures", "1", "--", "python3", "-c", script])
        .arg(&taken)
        .output()
        .expect("trainyard runs");
    let all = text(&output);
    assert!(output.status.success(), "{all}");
    let parts = "[('shard_0', 50331648), ('shard_1', 1024)]";
    for rank in 0..2 {
        assert!(
            all.contains(&format!("rank {rank} resumed with {parts}")),
            "the restart resumes from the checkpoint both ranks handed in, both parts whole: {all}"
        );
    }
    assert!(left_behind("survivor-s3", Duration::from_secs(10)).is_empty());
}

#[test]
fn a_survivors_part_that_persists_for_longer_than_the_stop_grace_still_commits() {
    let Some(server) = trainyard_checkpoint::testing::S3Server::start().expect("moto starts")
    else {
        return;
    };
    server.create_bucket("patient").expect("a bucket");
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let (go, taken) = (scratch.path().join("go"), scratch.path().join("taken"));
    // Rank 1's part is persisted before the storage stops; rank 0 hands its part in once it
    // has stopped, and rank 1 dies then: rank 0 is stopped while its part waits.
    let script = RESUMED_OR_A_SHARD.to_owned()
        + r#"
if rank == 1:
    train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(d),
                 checkpoint_upload_mode=train.CheckpointUploadMode.SYNC)
    print("persisted 1", flush=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.005)
    os._exit(3)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(d),
             checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
print("handed in 0", flush=True)
open(sys.argv[2], "w").close()
time.sleep(300)
"#;
    let mut run = Running::start(
        trainyard("patient-s3", "s3://patient/runs")
            .envs(server.env())
            .args(["--max-failures", "1", "--", "python3", "-c", &script])
            .args([&go, &taken]),
    );
    let signal = |signal| signal_server(&server, signal);
    assert!(
        run.wait_for("persisted 1", Duration::from_secs(60))
            .is_some(),
        "rank 1 persists its part: {}",
        run.stdout()
    );
    signal(nix::sys::signal::Signal::SIGSTOP);
    std::fs::write(&go, b"").expect("rank 0 is told to go");
    let handed_in = run
        .wait_for("handed in 0", Duration::from_secs(20))
        .is_some();
    // Longer than the stop's grace and the 10 s after it that a stopped task's end was once
    // given: the survivor's agent must go on waiting for its part.
    std::thread::sleep(Duration::from_secs(20));
    signal(nix::sys::signal::Signal::SIGCONT);
    assert!(handed_in, "rank 0's hand-in is taken: {}", run.stdout());
    let ended = run.finish(RUN_LIMIT);
    let (status, all) = (ended.status, ended.all());
    assert!(status.success(), "{all}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!("rank {rank} resumed with ['shard_0', 'shard_1']")),
            "the restart resumes from the checkpoint both ranks handed in: {all}"
        );
    }
    assert!(left_behind("patient-s3", Duration::from_secs(10)).is_empty());
}

#[test]
fn an_async_hand_in_the_agent_refuses_fails_the_ranks_next_report() {
    let storage = tempfile::tempdir().expect("a storage folder");
    // A named pipe is not a file a checkpoint may hold: the agent refuses the hand-in after
    // `report` has returned, and the rank's next report says so.
    let script = r#"
import os, tempfile
from trainyard import train
d = tempfile.mkdtemp()
os.mkfifo(os.path.join(d, "pipe"))
train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(d),
             checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
print("returned", flush=True)
try:
    train.report({"step": 2})
except train.ReportError as error:
    print(f"raised: index {error.index}: {error}", flush=True)
else:
    print("not raised", flush=True)
train.report({"step": 3})
print("the report after it is made", flush=True)
"#;
    let output = trainyard("async-refused", &storage.path().display().to_string())
        .args(["--", "python3", "-c", script])
        .output()
        .expect("trainyard runs");
    let all = text(&output);
    assert!(output.status.success(), "{all}");
    assert_eq!(all.matches("returned").count(), 2, "{all}");
    assert_eq!(
        all.matches("raised: index 1: an ASYNC report (checkpoint index 1) failed: ")
            .count(),
        2,
        "each rank's next report raises what the hand-in failed with: {all}"
    );
    assert!(
        all.contains("/pipe` is a FIFO; only regular files and directories are accepted"),
        "the agent's reason: {all}"
    );
    assert_eq!(
        all.matches("the report after it is made").count(),
        2,
        "{all}"
    );
    assert!(left_behind("async-refused", Duration::from_secs(10)).is_empty());
}

#[test]
fn a_rank_killed_right_after_an_async_report_still_has_it_handed_in() {
    let storage = tempfile::tempdir().expect("a storage folder");
    let tmp = tempfile::tempdir().expect("a temporary folder");
    // Each rank kills itself once `report` returned: its agent has the report, and takes and
    // persists the checkpoint after the rank is gone.
    let script = RESUMED_OR_A_SHARD.to_owned()
        + r#"
train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(d),
             checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
# Both ranks have reported before either dies (a rank still starting would be stopped).
open(os.path.join(sys.argv[1], f"reported_{rank}"), "w").close()
while len(os.listdir(sys.argv[1])) < 2:
    time.sleep(0.005)
import signal
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let reported = tempfile::tempdir().expect("a folder for the ranks' marks");
    let output = trainyard("async-killed", &storage.path().display().to_string())
        .env("TMPDIR", tmp.path())
        .args(["--max-failures", "1", "--", "python3", "-c", &script])
        .arg(reported.path())
        .output()
        .expect("trainyard runs");
    let all = text(&output);
    assert!(output.status.success(), "{all}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!("rank {rank} resumed with ['shard_0', 'shard_1']")),
            "the restart resumes from the checkpoint both ranks handed in: {all}"
        );
    }
    // The ranks' checkpoint directories were taken (renamed away) after the ranks died.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("the temporary folder")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name())
        .filter(|name| name.to_string_lossy().starts_with("tmp"))
        .collect();
    assert!(
        left.is_empty(),
        "every handed-in directory is taken: {left:?}"
    );
    assert!(left_behind("async-killed", Duration::from_secs(10)).is_empty());
}
