//! What another user of the machine can do to a user's runs, as two real users
//! (`trainyard_test_support::users`): a run folder put in a shared storage root by another
//! user, or changed by one, is refused before any worker starts (exit 2), never resumed.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use trainyard_test_support::processes::{MARKER, Sandbox, left_behind, wait_bounded};
use trainyard_test_support::users::{User, two_users};

/// `trainyard run` of `sh -c script` in run `name` of `storage`.
fn run(storage: &Path, name: &str, script: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["run", "--backend", "none", "--name", name])
        .arg("--storage")
        .arg(storage)
        .args(["--", "sh", "-c", script])
        .env(
            "TRAINYARD_LEDGER",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-users-{name}")),
        )
        .env("CI", "1")
        .env(MARKER, name)
        .stdin(Stdio::null())
        .output()
        .expect("trainyard runs")
}

pub(crate) fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A storage root every user may write to, as a shared 1777 directory is.
pub(crate) fn shared_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    root
}

pub(crate) fn as_user(user: &User, script: &str) {
    let (ok, said) = user.sh(script);
    assert!(ok, "{} could not `{script}`: {said}", user.name);
}

#[test]
fn a_run_folder_another_user_put_in_a_shared_storage_is_refused_not_resumed() {
    let Some(users) = two_users() else {
        return;
    };
    // A resumable run (it failed) with a checkpoint folder, made where the other user can
    // copy it from.
    let made = tempfile::tempdir().expect("temp dir");
    let failed = run(made.path(), "victim", "exit 3");
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    std::fs::create_dir(made.path().join("victim/checkpoint_000001")).expect("dir");
    std::fs::write(
        made.path().join("victim/checkpoint_000001/model.pt"),
        "evil",
    )
    .expect("file");
    for path in [made.path(), &made.path().join("victim")] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(made.path())
        .status();

    let shared = shared_root();
    let planted = shared.path().join("victim");
    as_user(
        &users.second,
        &format!(
            "cp -r {} {}",
            made.path().join("victim").display(),
            planted.display()
        ),
    );
    let marker = shared.path().join("ran");
    let output = run(
        shared.path(),
        "victim",
        &format!("touch {}", marker.display()),
    );
    let all = text(&output);
    assert_eq!(output.status.code(), Some(2), "{all}");
    assert!(
        all.contains(&format!(
            "`{}` is owned by uid {} with mode 0",
            planted.display(),
            users.second.uid
        )) && all
            .contains("must be owned by this user (uid 0) or root and writable by no one else"),
        "{all}"
    );
    assert!(!marker.exists(), "the task did not run: {all}");
}

#[test]
fn a_run_folder_others_could_write_to_or_a_link_in_it_is_refused() {
    let Some(users) = two_users() else {
        return;
    };
    let shared = shared_root();
    let first = run(shared.path(), "mine", "exit 3");
    assert_eq!(first.status.code(), Some(1), "{}", text(&first));
    let folder = shared.path().join("mine");
    let meta = std::fs::metadata(&folder).expect("the run folder");
    assert_eq!(meta.mode() & 0o7777, 0o700, "a run folder is made private");

    // Opened to everyone (by an older trainyard or a chmod), and another user's link put
    // in place of its logs.
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let elsewhere = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    as_user(
        &users.second,
        &format!(
            "mv {logs} {logs}-moved && ln -s {elsewhere} {logs}",
            logs = folder.join("logs").display(),
            elsewhere = elsewhere.path().display()
        ),
    );
    let output = run(shared.path(), "mine", "echo again");
    let all = text(&output);
    assert_eq!(output.status.code(), Some(2), "{all}");
    assert!(
        all.contains(&format!(
            "`{}` is owned by uid 0 with mode 0777",
            folder.display()
        )),
        "{all}"
    );

    // Closed again, the link itself is refused.
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let output = run(shared.path(), "mine", "echo again");
    let all = text(&output);
    assert_eq!(output.status.code(), Some(2), "{all}");
    assert!(
        all.contains(&format!(
            "`{}` is a symbolic link",
            folder.join("logs").display()
        )),
        "{all}"
    );
    assert!(
        std::fs::read_dir(elsewhere.path())
            .expect("list")
            .next()
            .is_none(),
        "nothing was written through the link"
    );
}

/// Another user's side of the warm Python's socket: watches `SHARED` (the victim's temporary
/// directory) for the warm Python's folder and, while it may enter it, keeps a socket of its
/// own in the place of `warm.sock` (a hard link renamed over it, again and again); what a
/// connection to it sends is written to `SHARED/stolen`. Ends after 60 s, or once it was sent
/// something.
const WARM_THIEF: &str = r#"
import glob, os, socket, sys, time
shared = sys.argv[1]
server, bound_in = None, None
deadline = time.time() + 60
while time.time() < deadline:
    for folder in glob.glob(os.path.join(shared, "trainyard-warm-*")):
        try:
            if server is None:
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.bind(os.path.join(folder, "thief.sock"))
                server.listen(8)
                server.settimeout(0.002)
                bound_in = folder
            if folder == bound_in:
                os.link(os.path.join(folder, "thief.sock"), os.path.join(folder, "thief.link"))
                os.rename(os.path.join(folder, "thief.link"), os.path.join(folder, "warm.sock"))
        except OSError:
            if bound_in is None and server is not None:
                server.close()
                server = None
    if server is not None and bound_in is not None:
        try:
            conn, _ = server.accept()
        except OSError:
            pass
        else:
            conn.settimeout(5)
            head, fds, _, _ = socket.recv_fds(conn, 4, 8)
            length, body = int.from_bytes(head, "big"), b""
            while len(body) < length:
                chunk = conn.recv(length - len(body))
                if not chunk:
                    break
                body += chunk
            with open(os.path.join(shared, "stolen"), "wb") as out:
                out.write(body)
            token = b'"token"' in body
            print(f"thief: got {len(body)} bytes (the token: {token}) and {len(fds)} descriptors", flush=True)
            sys.exit(0)
    time.sleep(0.002)
print("thief: nothing", flush=True)
"#;

#[test]
fn another_user_cannot_take_the_warm_pythons_place_whatever_the_victims_umask() {
    let Some(users) = two_users() else {
        return;
    };
    let sandbox = Sandbox::new("warm-thief");
    // The victim's temporary directory is shared, as /tmp is; its umask lets anyone in.
    let shared = shared_root();
    // A module the warm Python takes 3 s to import: its socket is not there meanwhile, and
    // an agent that finds one connects at once.
    let modules = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        modules.path().join("slow_import.py"),
        "import time\ntime.sleep(3)\n",
    )
    .expect("written");
    let thief_script = shared.path().join("thief.py");
    std::fs::write(&thief_script, WARM_THIEF).expect("written");
    std::fs::set_permissions(&thief_script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let thief = users
        .second
        .command(
            "python3",
            &[
                thief_script.to_str().expect("UTF-8"),
                shared.path().to_str().expect("UTF-8"),
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the thief starts");
    let thief = KillOnDrop(thief);

    let victim = Command::new("sh")
        .args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_trainyard"))
        .args(["run", "--backend", "none", "--warm-python", "slow_import"])
        .args(["--", "python3", "-c", "print('the victim ran')"])
        .envs(sandbox.env())
        .env(MARKER, sandbox.mark())
        .env("TMPDIR", shared.path())
        .env("PYTHONPATH", modules.path())
        .env("CI", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    let out = wait_bounded(victim, Duration::from_secs(120));
    let all = text(&out);
    let thief = thief.finish();
    if crate::warm::no_cgroups_here(&all) {
        assert!(
            std::env::var("CI").ok().as_deref() != Some("true"),
            "under CI=true workers get cgroups, and ranks start warm: {all}"
        );
        eprintln!("SKIP: workers get no cgroup on this machine, so their ranks start cold");
        return;
    }
    assert!(
        !shared.path().join("stolen").exists(),
        "another user was sent the warm Python's request: {thief}\n{all}"
    );
    assert!(out.status.success(), "{all}\n{thief}");
    assert!(all.contains("the victim ran"), "{all}");
    assert!(
        !all.contains("starts cold"),
        "the rank started from the warm Python: {all}"
    );
    let left = left_behind(sandbox.mark(), Duration::from_secs(5));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// A child process killed and reaped when dropped (a test that fails first leaves none).
pub(crate) struct KillOnDrop(pub(crate) std::process::Child);

impl KillOnDrop {
    /// Kills it, and what it printed.
    pub(crate) fn finish(mut self) -> String {
        let _ = self.0.kill();
        let mut said = String::new();
        if let Some(mut out) = self.0.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut out, &mut said);
        }
        if let Some(mut err) = self.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut err, &mut said);
        }
        said
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A record of a running run `name` that names process `pid` of this host as its driver, its
/// uid, host and start time copied from `/proc` as anyone may read them.
pub(crate) fn forged_record(name: &str, pid: u32) -> serde_json::Value {
    let start_ticks = trainyard_sys::procfs::read_stat(pid)
        .expect("readable")
        .and_then(|stat| stat.start_time)
        .expect("a start time");
    let host = nix::unistd::gethostname()
        .expect("a host name")
        .into_string()
        .expect("UTF-8");
    serde_json::json!({
        "version": 3,
        "name": name,
        "status": "running",
        "driver": {
            "user": "root",
            "uid": nix::unistd::getuid().as_raw(),
            "host": host,
            "pid": pid,
            "command": ["trainyard", "run", "--", "true"],
            "started_at": 1.0,
            "start_ticks": start_ticks,
        },
        "attempts": [],
        "checkpoints": [],
        "latest_checkpoint": null,
        "last_index": 0,
    })
}

/// Writes `record` (JSON) as the `run.json` of run `record["name"]` in `storage` (opened with
/// `env`): as anyone who may write to that storage could.
pub(crate) fn save_record(
    env: &std::collections::BTreeMap<String, String>,
    storage: &str,
    record: serde_json::Value,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let storage =
            trainyard_checkpoint::Storage::open(storage.parse().expect("a location"), env)
                .expect("opened");
        let name = record["name"].as_str().expect("a name").to_owned();
        let record = serde_json::from_value(record).expect("a record");
        storage.run(&name).save(&record).await.expect("saved");
    });
}

/// `trainyard stop NAME --storage STORAGE`, with `env`.
fn stop(storage: &str, name: &str, env: &std::collections::BTreeMap<String, String>) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["stop", name, "--storage", storage])
        .envs(env)
        .env("CI", "1")
        .stdin(Stdio::null())
        .output()
        .expect("trainyard runs")
}

/// A process of the victim's that a stop must never reach (its shell, say).
pub(crate) fn victims_process() -> KillOnDrop {
    KillOnDrop(
        Command::new("sleep")
            .arg("120")
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep starts"),
    )
}

#[test]
fn a_record_another_user_forged_in_a_shared_storage_cannot_make_stop_signal_the_victim() {
    let Some(users) = two_users() else {
        return;
    };
    let shared = shared_root();
    let mut shell = victims_process();
    let staged = shared.path().join("forged.json");
    std::fs::write(&staged, forged_record("forged", shell.0.id()).to_string()).expect("written");
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    as_user(
        &users.second,
        &format!(
            "mkdir -m 700 {dir} && cp {staged} {dir}/run.json",
            dir = shared.path().join("forged").display(),
            staged = staged.display()
        ),
    );
    let out = stop(
        shared.path().to_str().expect("UTF-8"),
        "forged",
        &std::collections::BTreeMap::new(),
    );
    let all = text(&out);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        shell.0.try_wait().expect("waitable").is_none(),
        "the victim's process was signalled: {all}"
    );
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(&format!("is owned by uid {}", users.second.uid)),
        "the folder is refused as another user's: {all}"
    );
}

#[test]
fn a_record_forged_in_s3_storage_cannot_make_stop_signal_a_process_that_holds_no_driver_lock() {
    let Some(server) = trainyard_checkpoint::testing::S3Server::start().expect("moto starts")
    else {
        return;
    };
    server.create_bucket("shared").expect("a bucket");
    let mut shell = victims_process();
    let env = server.env();
    // Anyone who may write to the bucket may write this.
    save_record(
        &env,
        "s3://shared/runs",
        forged_record("forged", shell.0.id()),
    );
    let out = stop("s3://shared/runs", "forged", &env);
    let all = text(&out);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        shell.0.try_wait().expect("waitable").is_none(),
        "the process the record names was signalled: {all}"
    );
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("holds its driver lock on this host: nothing is signalled"),
        "{all}"
    );
}
