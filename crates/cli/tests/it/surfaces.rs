//! What another user of the machine (or anyone who may write to a run's remote storage) can
//! do through the surfaces that read and write files for a run: a detached run's output
//! file, `trainyard logs` of remote storage, `--log-dir` and `show --html` in shared folders,
//! what `show` and `ps` print of a record, TensorBoard's files, and the secrets on a
//! command line. Each test plays the other user where one is needed (two real users,
//! `trainyard_test_support::users`, as root) and says what it guards against.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trainyard_checkpoint::testing::S3Server;
use trainyard_test_support::processes::MARKER;
use trainyard_test_support::users::two_users;

use crate::users::{as_user, forged_record, save_record, shared_root, text};

/// `trainyard ARGS`, confined to a ledger of `mark`'s own.
fn trainyard(mark: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .env(
            "TRAINYARD_LEDGER",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-surfaces-{mark}")),
        )
        .env("CI", "1")
        .env(MARKER, mark)
        .env_remove("TRAINYARD_NOTIFY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `path` as a `&str`.
fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8")
}

/// Waits up to 60 s for run `name` of local `storage` to be over (its record says so).
fn wait_until_over(storage: &Path, name: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let record: Option<serde_json::Value> = std::fs::read(storage.join(name).join("run.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        if let Some(record) = record.filter(|r| r["status"] != "running") {
            return record;
        }
        assert!(Instant::now() < deadline, "run `{name}` is still running");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_detached_runs_output_beside_shared_run_folders_never_goes_into_another_users_file() {
    let Some(users) = two_users() else {
        return;
    };
    let shared = shared_root();
    // The other user makes, writable by all, the file the driver's output would go to under a
    // name that can be guessed (`.driver-NAME-PID.log`), for the next few hundred pids.
    let plant = format!(
        "import os\nlast = int(open('/proc/sys/kernel/ns_last_pid').read())\nfor pid in range(last + 1, last + 400):\n    path = os.path.join({dir:?}, f'.driver-victim-{{pid}}.log')\n    open(path, 'w').close()\n    os.chmod(path, 0o666)\n",
        dir = s(shared.path())
    );
    let (planted, said) = users
        .second
        .sh(&format!("python3 -c \"{}\"", plant.replace('"', "\\\"")));
    assert!(planted, "{said}");
    let out = trainyard("detach-shared")
        .args(["run", "--detach", "--backend", "none", "--name", "victim"])
        .args(["--storage", s(shared.path())])
        .args(["--", "sh", "-c", "echo the-victims-output; sleep 2"])
        .output()
        .expect("trainyard runs");
    assert!(out.status.success(), "{}", text(&out));
    let record = wait_until_over(shared.path(), "victim");
    assert_eq!(record["status"], "finished", "{record}");
    let logs: Vec<PathBuf> = std::fs::read_dir(shared.path().join("victim"))
        .expect("the run folder")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("driver-"))
        })
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let meta = std::fs::symlink_metadata(&logs[0]).expect("the driver's output");
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777),
        (nix::unistd::getuid().as_raw(), 0o600),
        "the driver's output is the victim's own file, not the other user's"
    );
    let planted: Vec<PathBuf> = std::fs::read_dir(shared.path())
        .expect("the storage")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| std::fs::metadata(path).is_ok_and(|m| m.uid() == users.second.uid))
        .collect();
    assert!(!planted.is_empty(), "the other user's files are there");
    for path in planted {
        assert_eq!(
            std::fs::metadata(&path).expect("there").len(),
            0,
            "{} holds the victim's output",
            path.display()
        );
    }
}

#[test]
fn a_detached_runs_output_file_of_another_users_is_refused() {
    let Some(users) = two_users() else {
        return;
    };
    let shared = shared_root();
    let file = shared.path().join("out.log");
    as_user(
        &users.second,
        &format!(": > {0} && chmod 666 {0}", file.display()),
    );
    let storage = tempfile::tempdir().expect("temp dir");
    let out = trainyard("detach-output")
        .args(["run", "--detach", "--backend", "none", "--name", "victim"])
        .args(["--storage", s(storage.path()), "--output", s(&file)])
        .args(["--", "sh", "-c", "echo the-victims-output"])
        .output()
        .expect("trainyard runs");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains(&format!(
            "it is uid {}'s, not this user's",
            users.second.uid
        )),
        "{all}"
    );
    assert_eq!(std::fs::metadata(&file).expect("there").len(), 0);
}

#[test]
fn logs_of_a_remote_run_are_downloaded_where_no_other_user_can_read_them() {
    let Some(users) = two_users() else {
        return;
    };
    let Some(server) = S3Server::start().expect("moto starts") else {
        return;
    };
    server.create_bucket("logs").expect("a bucket");
    let storage = "s3://logs/runs";
    // The run stages its logs in a folder of its own, gone afterwards as on another host.
    let staging = tempfile::tempdir().expect("temp dir");
    let loud = "for i in range(4000): print('the victims secret line', i, 'x' * 100)";
    let out = trainyard("logs-remote")
        .args([
            "run",
            "--backend",
            "none",
            "--name",
            "loud",
            "--storage",
            storage,
        ])
        .args(["--", "python3", "-c", loud])
        .envs(server.env())
        .env("TMPDIR", staging.path())
        .output()
        .expect("trainyard runs");
    assert!(out.status.success(), "{}", text(&out));
    drop(staging);

    // `trainyard logs` downloads them into the shared temporary folder; its stdout is not
    // read, so it waits there (with the download) once the pipe is full.
    let shared = shared_root();
    let mut logs = trainyard("logs-remote")
        .args(["logs", "loud", "--storage", storage])
        .envs(server.env())
        .env("TMPDIR", shared.path())
        .spawn()
        .expect("trainyard logs starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let downloaded = loop {
        let found = std::fs::read_dir(shared.path())
            .expect("the shared folder")
            .flatten()
            .map(|entry| entry.path().join("rank_0.log"))
            .find(|path| path.exists());
        if let Some(found) = found {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no download appeared in {}",
            shared.path().display()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (read, said) = users
        .second
        .sh(&format!("head -c 200 {}", downloaded.display()));
    let folder = downloaded.parent().expect("its folder");
    let modes = (
        std::fs::metadata(folder).expect("there").mode() & 0o777,
        std::fs::metadata(&downloaded).expect("there").mode() & 0o777,
    );
    let mut printed = String::new();
    if let Some(mut stdout) = logs.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut stdout, &mut printed);
    }
    let status = logs.wait().expect("reaped");
    assert!(status.success());
    assert!(printed.contains("the victims secret line 3999"));
    assert!(
        !read && !said.contains("secret"),
        "another user read the download: {said}"
    );
    assert_eq!(modes, (0o700, 0o600));
}

#[test]
fn a_log_dir_in_a_shared_folder_never_writes_into_another_users_file_or_through_a_link() {
    let Some(users) = two_users() else {
        return;
    };
    let shared = shared_root();
    let storage = tempfile::tempdir().expect("temp dir");
    // The other user's attempt folder and rank file, open to all.
    let planted = shared.path().join("logs/attempt_0/rank_0.log");
    as_user(
        &users.second,
        &format!(
            "mkdir -p {dir} && : > {file} && chmod 777 {top} {dir} && chmod 666 {file}",
            dir = planted.parent().expect("a folder").display(),
            top = shared.path().join("logs").display(),
            file = planted.display()
        ),
    );
    let out = trainyard("log-dir")
        .args(["run", "--backend", "none", "--name", "first"])
        .args(["--storage", s(storage.path())])
        .args(["--log-dir", s(&shared.path().join("logs"))])
        .args(["--", "sh", "-c", "echo the-victims-secret"])
        .output()
        .expect("trainyard runs");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("the-victims-secret"), "{all}");
    assert!(
        all.contains(&format!("is refused: it is uid {}'s", users.second.uid)),
        "the folder is refused, saying why: {all}"
    );
    assert_eq!(std::fs::metadata(&planted).expect("there").len(), 0);

    // The other user's link in the attempt folder's place, to a folder of the victim's.
    let own = tempfile::tempdir().expect("temp dir");
    std::fs::write(own.path().join("rank_0.log"), "precious").expect("written");
    as_user(
        &users.second,
        &format!(
            "mkdir -p {top} && ln -s {own} {top}/attempt_0",
            top = shared.path().join("linked").display(),
            own = own.path().display()
        ),
    );
    let out = trainyard("log-dir")
        .args(["run", "--backend", "none", "--name", "second"])
        .args(["--storage", s(storage.path())])
        .args(["--log-dir", s(&shared.path().join("linked"))])
        .args(["--", "sh", "-c", "echo the-victims-secret"])
        .output()
        .expect("trainyard runs");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("it is a link"), "{all}");
    assert_eq!(
        std::fs::read_to_string(own.path().join("rank_0.log")).expect("there"),
        "precious"
    );
}

#[test]
fn show_html_never_writes_through_a_link_or_into_another_users_file() {
    let Some(users) = two_users() else {
        return;
    };
    let storage = tempfile::tempdir().expect("temp dir");
    let out = trainyard("show-html")
        .args(["run", "--backend", "none", "--name", "shown"])
        .args(["--storage", s(storage.path()), "--", "true"])
        .output()
        .expect("trainyard runs");
    assert!(out.status.success(), "{}", text(&out));
    let own = tempfile::tempdir().expect("temp dir");
    let precious = own.path().join("precious");
    std::fs::write(&precious, "precious").expect("written");
    let shared = shared_root();
    let link = shared.path().join("page.html");
    let theirs = shared.path().join("theirs.html");
    as_user(
        &users.second,
        &format!(
            "ln -s {precious} {link} && : > {theirs} && chmod 666 {theirs}",
            precious = precious.display(),
            link = link.display(),
            theirs = theirs.display()
        ),
    );
    for (page, why) in [
        (&link, "it is a link".to_owned()),
        (&theirs, format!("it is uid {}'s", users.second.uid)),
    ] {
        let out = trainyard("show-html")
            .args([
                "show",
                "shown",
                "--storage",
                s(storage.path()),
                "--html",
                s(page),
            ])
            .output()
            .expect("trainyard runs");
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{all}");
        assert!(all.contains(&why), "{all}");
    }
    assert_eq!(
        std::fs::read_to_string(&precious).expect("there"),
        "precious"
    );
    assert_eq!(std::fs::metadata(&theirs).expect("there").len(), 0);
}

#[test]
fn show_and_ps_print_what_a_record_holds_inert() {
    let Some(server) = S3Server::start().expect("moto starts") else {
        return;
    };
    server.create_bucket("escapes").expect("a bucket");
    let mut record = forged_record("esc", std::process::id());
    record["status"] = "failed".into();
    record["driver"]["user"] = "\u{1b}]0;pwned\u{7}".into();
    record["driver"]["host"] = "elsewhere\u{1b}[2J".into();
    record["attempts"] = serde_json::json!([{
        "restart_count": 0,
        "started_at": 1.0,
        "ended_at": 2.0,
        "failure": "boom\u{1b}[31m\u{9b}1m\u{202e}evil\nrun esc: finished",
    }]);
    record["checkpoints"] = serde_json::json!([{
        "index": 1,
        "dir": "checkpoint_000001",
        "metrics": {"\u{1b}[8mhidden": 1.5},
        "files": [],
        "bytes": 0,
        "committed_at": 2.0,
    }]);
    record["latest_checkpoint"] = 1.into();
    record["last_index"] = 1.into();
    let env = server.env();
    save_record(&env, "s3://escapes/runs", record);
    for args in [&["show", "esc"][..], &["ps", "--all"][..]] {
        let out = trainyard("escapes")
            .args(args)
            .args(["--storage", "s3://escapes/runs"])
            .envs(&env)
            .output()
            .expect("trainyard runs");
        let all = text(&out);
        assert!(out.status.success(), "{args:?}: {all}");
        for raw in ['\u{1b}', '\u{9b}', '\u{202e}', '\u{7}'] {
            assert!(
                !all.contains(raw),
                "{args:?} printed {:?} as it is: {all:?}",
                raw
            );
        }
        if args[0] == "show" {
            assert!(all.contains("\\u{1b}"), "{args:?}: {all}");
        }
        assert!(
            !all.lines()
                .any(|line| line.trim_start().starts_with("run esc: finished")),
            "{args:?} printed a line the record made up: {all}"
        );
    }
}

#[test]
fn secrets_given_through_the_environment_or_a_file_stay_off_every_command_line() {
    let storage = tempfile::tempdir().expect("temp dir");
    let scratch = tempfile::tempdir().expect("temp dir");
    let env_file = scratch.path().join("secrets.env");
    std::fs::write(
        &env_file,
        "# for the workers\nFROM_FILE=file-s3cret\n\nFROM_ENV_IN_FILE\n",
    )
    .expect("written");
    let out = trainyard("secrets")
        .args(["run", "--backend", "none", "--name", "fg"])
        .args(["--storage", s(storage.path())])
        .args(["--env", "FROM_ENV", "--env-file", s(&env_file)])
        .args([
            "--",
            "sh",
            "-c",
            "echo got $FROM_ENV $FROM_FILE $FROM_ENV_IN_FILE",
        ])
        .env("FROM_ENV", "env-s3cret")
        .env("FROM_ENV_IN_FILE", "env-file-s3cret")
        .output()
        .expect("trainyard runs");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("got env-s3cret file-s3cret env-file-s3cret"),
        "{all}"
    );
    let record = std::fs::read_to_string(storage.path().join("fg/run.json")).expect("run.json");
    assert!(!record.contains("s3cret"), "{record}");

    // Detached, with the secrets on the command line: the background driver gets them in its
    // environment, not its arguments.
    let out = trainyard("secrets")
        .args(["run", "--detach", "--backend", "none", "--name", "bg"])
        .args(["--storage", s(storage.path())])
        .args([
            "--env",
            "TOKEN=cmd-s3cret",
            "--notify",
            "http://127.0.0.1:9/T0K3N-s3cret",
        ])
        .args(["--", "sh", "-c", "echo got $TOKEN; sleep 3"])
        .output()
        .expect("trainyard runs");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let pid: u32 = all
        .split("driver pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no driver pid in: {all}"));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the driver runs");
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains("--env TOKEN"), "{cmdline}");
    assert!(!cmdline.contains("s3cret"), "{cmdline}");
    wait_until_over(storage.path(), "bg");
    let output: String = std::fs::read_dir(storage.path().join("bg"))
        .expect("the run folder")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("driver-"))
        .map(|entry| std::fs::read_to_string(entry.path()).expect("readable"))
        .collect();
    assert!(output.contains("got cmd-s3cret"), "{output}");
    let record = std::fs::read_to_string(storage.path().join("bg/run.json")).expect("run.json");
    assert!(!record.contains("s3cret"), "{record}");
}

#[test]
fn an_env_value_that_is_not_in_the_environment_is_bad_input_naming_the_flag() {
    let out = trainyard("secrets-missing")
        .args([
            "run",
            "--backend",
            "none",
            "--env",
            "NOT_SET_ANYWHERE",
            "--",
            "true",
        ])
        .env_remove("NOT_SET_ANYWHERE")
        .output()
        .expect("trainyard runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("invalid value `NOT_SET_ANYWHERE` for `--env`"),
        "{}",
        text(&out)
    );
}

#[test]
fn tensorboard_event_files_are_the_users_alone_whatever_the_umask() {
    let storage = tempfile::tempdir().expect("temp dir");
    let scratch = tempfile::tempdir().expect("temp dir");
    let events = scratch.path().join("tb");
    let script = "from trainyard import train\nfor step in range(2):\n    train.report({'loss': 1.0 / (step + 1)})\n";
    let out = Command::new("sh")
        .args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_trainyard"))
        .args(["run", "--backend", "none", "--name", "boarded"])
        .args(["--storage", s(storage.path()), "--tensorboard", s(&events)])
        .args(["--", "python3", "-c", script])
        .env(
            "TRAINYARD_LEDGER",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("ledger-surfaces-tensorboard"),
        )
        .env("CI", "1")
        .stdin(Stdio::null())
        .output()
        .expect("trainyard runs");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::metadata(&events).expect("made").mode() & 0o777,
        0o700
    );
    let files: Vec<u32> = std::fs::read_dir(&events)
        .expect("listed")
        .flatten()
        .map(|entry| entry.metadata().expect("there").mode() & 0o777)
        .collect();
    assert_eq!(files, [0o600]);
}
