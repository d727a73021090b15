//! What another user of the machine can do to a user's runs, as two real users
//! (`trainyard_test_support::users`): a run folder put in a shared storage root by another
//! user, or changed by one, is refused before any worker starts (exit 2), never resumed.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use trainyard_test_support::processes::MARKER;
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

fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A storage root every user may write to, as a shared 1777 directory is.
fn shared_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    root
}

fn as_user(user: &User, script: &str) {
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
