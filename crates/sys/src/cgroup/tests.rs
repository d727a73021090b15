//! The driver's cgroups against a fake v2 tree, and against this machine's cgroupfs where it
//! lets the tests make cgroups (else they say `SKIP:` and pass).

use std::fs;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::member::{LimitError, join_self};

use super::fake::{SOMEONE_ELSE, fake_host};
use super::owner::{DIR_PREFIX, LEAF_RUN};
use super::setup::lists_controller;
use super::tree::parse_procs;
use super::*;

const MIB: u64 = 1024 * 1024;

#[test]
fn without_a_cgroup_create_run_reports_the_probe_reason() {
    let rlimit = MemoryEnforcement::Rlimit {
        why: "no memory controller line in /proc/self/cgroup".to_owned(),
    };
    let err = rlimit
        .create_run("job")
        .expect_err("no cgroup to create in");
    assert!(
        err.to_string().contains("no memory controller line"),
        "{err}"
    );
    let v1 = MemoryEnforcement::CgroupV1 {
        parent: PathBuf::from("/nonexistent"),
    };
    assert!(matches!(
        v1.create_run("../escape"),
        Err(CgroupError::InvalidName { .. })
    ));
}
#[test]
fn a_worker_without_a_limit_gets_a_cgroup_whose_processes_are_killed_and_which_stays() {
    let (tree, job) = fake_host(&[]);
    let enforcement = MemoryEnforcement::CgroupV2 {
        parent: job.clone(),
    };
    let run = enforcement
        .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "unlimited")
        .expect("the run's cgroup is made");
    let worker = run
        .create_unlimited_worker("actor-0")
        .expect("the worker's cgroup is made");
    assert_eq!(worker.limit(), None);
    let max = fs::read_to_string(worker.path().join("memory.max")).expect("read");
    assert_eq!(max.trim(), "max", "no limit is written");
    worker.join(SOMEONE_ELSE).expect("a worker joins");
    worker.kill_all();
    assert!(
        tree.killed.lock().expect("lock").contains(&SOMEONE_ELSE),
        "its process is killed"
    );
    assert!(tree.procs(worker.path()).is_empty());
    assert!(worker.path().is_dir(), "killing leaves the cgroup");
    assert!(matches!(
        run.create_unlimited_worker("../x"),
        Err(CgroupError::InvalidName { .. })
    ));
    run.remove();
    assert!(!worker.path().exists());
}

#[test]
fn on_cgroup_v2_the_driver_moves_into_a_leaf_so_that_its_cgroup_can_limit_workers() {
    let (tree, job) = fake_host(&[]);
    let me = Owner::this_process();
    let enforcement = MemoryEnforcement::CgroupV2 {
        parent: job.clone(),
    };
    let run = enforcement
        .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "job-1")
        .expect("the run's cgroup is made");
    let leaf = job.join(owned_dir_name(LEAF_RUN, &me));
    assert_eq!(tree.procs(&leaf), [me.pid], "the driver is in its leaf");
    assert!(
        tree.procs(&job).is_empty(),
        "no process is left in the parent"
    );
    let enabled = fs::read_to_string(job.join("cgroup.subtree_control")).expect("read");
    assert!(lists_controller(&enabled, "memory"), "{enabled:?}");
    assert_eq!(run.path(), job.join(owned_dir_name("job-1", &me)));

    let worker = run
        .create_worker("rank-0", 64 * MIB)
        .expect("the worker's cgroup is made");
    let read = |file: &str| fs::read_to_string(worker.path().join(file)).expect("read");
    assert_eq!(read("memory.max").trim(), (64 * MIB).to_string());
    assert_eq!(read("memory.swap.max").trim(), "0");
    assert_eq!(read("memory.oom.group").trim(), "1");
    worker.join(SOMEONE_ELSE).expect("a worker joins");
    assert_eq!(worker.oom_kills(), 0);

    // A second run of the same driver finds the controller enabled and the driver moved.
    let again = enforcement
        .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "job-2")
        .expect("a second run");
    again.remove();
    run.remove();
    assert!(!worker.path().exists() && !job.join(owned_dir_name("job-1", &me)).exists());
    assert!(
        tree.killed.lock().expect("lock").contains(&SOMEONE_ELSE),
        "what was left in the worker's cgroup is killed"
    );
    assert_eq!(tree.procs(&leaf), [me.pid], "the driver stays in its leaf");
}

#[test]
fn on_cgroup_v2_other_processes_beside_the_driver_make_limits_fall_back_with_why() {
    let (tree, job) = fake_host(&[SOMEONE_ELSE]);
    let enforcement = MemoryEnforcement::CgroupV2 {
        parent: job.clone(),
    };
    let error = enforcement
        .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "job")
        .expect_err("the other process keeps the controller off");
    assert!(
        matches!(&error, CgroupError::ControllerBusy { path, others: 1, .. } if *path == job),
        "{error:?}"
    );
    assert!(error.to_string().contains("1 other process"), "{error}");
    assert_eq!(
        tree.procs(&job),
        [SOMEONE_ELSE],
        "the other process is not moved"
    );
    let runs: Vec<_> = tree
        .children(&job)
        .expect("list")
        .into_iter()
        .filter_map(|dir| {
            let name = dir.file_name()?.to_str()?.to_owned();
            parse_run_dir_name(&name).map(|(run, _)| run.to_owned())
        })
        .collect();
    assert_eq!(runs, [LEAF_RUN], "no run cgroup is left behind");
}

#[test]
fn on_cgroup_v2_a_driver_in_its_leaf_makes_its_runs_beside_it() {
    let (tree, job) = fake_host(&[]);
    MemoryEnforcement::CgroupV2 {
        parent: job.clone(),
    }
    .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "first")
    .expect("the first run moves the driver")
    .remove();
    let leaf = owned_dir_name(LEAF_RUN, &Owner::this_process());
    let mountinfo = format!(
        "41 31 0:38 / {} rw,relatime - cgroup2 cgroup2 rw\n",
        tree.root().display()
    );
    let probed =
        MemoryEnforcement::probe_in(tree.as_ref(), &format!("0::/job/{leaf}\n"), &mountinfo);
    assert_eq!(
        probed,
        MemoryEnforcement::CgroupV2 {
            parent: job.clone()
        }
    );
    let probed = MemoryEnforcement::probe_in(tree.as_ref(), "0::/job\n", &mountinfo);
    assert_eq!(probed, MemoryEnforcement::CgroupV2 { parent: job });
}

#[test]
fn sweeping_judges_a_directory_by_its_drivers_pid_and_start_time() {
    let (tree, job) = fake_host(&[]);
    let me = Owner::this_process();
    let Some(start) = me.start_time else {
        eprintln!("SKIP: sweeping test: /proc/self/stat has no start time");
        return;
    };
    let reused = Owner {
        pid: me.pid,
        start_time: Some(start.wrapping_sub(1)),
    };
    let gone = Owner {
        pid: i32::MAX.unsigned_abs(),
        start_time: Some(1),
    };
    let kept = [
        owned_dir_name("ours", &me),
        owned_dir_name(LEAF_RUN, &me),
        // An earlier version's name: this pid runs, so it is kept.
        format!("{DIR_PREFIX}legacy-{}", me.pid),
        "not-ours".to_owned(),
    ];
    let swept = [
        owned_dir_name("reused-pid", &reused),
        owned_dir_name(LEAF_RUN, &reused),
        owned_dir_name("gone", &gone),
        format!("{DIR_PREFIX}legacy-{}", i32::MAX),
    ];
    for name in kept.iter().chain(&swept) {
        tree.mkdir(&job.join(name)).expect("mkdir");
    }
    let stale_worker = job.join(&swept[0]).join("rank-0");
    tree.mkdir(&stale_worker).expect("mkdir worker");
    tree.place(&stale_worker, SOMEONE_ELSE);

    assert_eq!(sweep_stale_in(tree.as_ref(), &job), swept.len());
    for name in &kept {
        assert!(job.join(name).is_dir(), "{name} was swept");
    }
    for name in &swept {
        assert!(!job.join(name).exists(), "{name} was not swept");
    }
    assert_eq!(*tree.killed.lock().expect("lock"), [SOMEONE_ELSE]);
}

// ---------------------------------------------------------------------------------------
// Against the real cgroupfs of this machine.

/// The probed parent cgroup, or `None` after printing why the test is skipped.
fn cgroup_or_skip(test: &str) -> Option<MemoryEnforcement> {
    match MemoryEnforcement::probe() {
        MemoryEnforcement::Rlimit { why } => {
            eprintln!("SKIP: {test}: no usable memory cgroup ({why})");
            None
        }
        cgroup => Some(cgroup),
    }
}

/// A run's cgroup, or `None` after printing why the test is skipped (on cgroup v2, say,
/// where the test's cgroup holds other processes).
fn run_or_skip(enforcement: &MemoryEnforcement, test: &str) -> Option<RunCgroup> {
    match enforcement.create_run(test) {
        Ok(run) => Some(run),
        Err(error) => {
            eprintln!("SKIP: {test}: cannot create a run cgroup ({error})");
            None
        }
    }
}

fn parent_of(enforcement: &MemoryEnforcement) -> &Path {
    match enforcement {
        MemoryEnforcement::CgroupV1 { parent } | MemoryEnforcement::CgroupV2 { parent } => parent,
        MemoryEnforcement::Rlimit { .. } => unreachable!("cgroup_or_skip returns cgroups only"),
    }
}

/// Waits at most `limit`, killing the child and failing the test on timeout.
pub(super) fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} did not exit within {limit:?}", child.id());
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn python(script: &str) -> Command {
    let mut command = Command::new("python3");
    command
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

#[test]
fn a_worker_over_its_limit_is_oom_killed_and_counted_then_everything_is_removed() {
    let Some(enforcement) = cgroup_or_skip("oom test") else {
        return;
    };
    let Some(run) = run_or_skip(&enforcement, "oom-test") else {
        return;
    };
    let worker = run
        .create_worker("rank-0", 64 * MIB)
        .expect("create worker");
    let limit_file = match enforcement {
        MemoryEnforcement::CgroupV2 { .. } => "memory.max",
        _ => "memory.limit_in_bytes",
    };
    let written = fs::read_to_string(worker.path().join(limit_file)).expect("read limit");
    assert_eq!(written.trim(), (64 * MIB).to_string());
    assert_eq!(worker.limit(), Some(64 * MIB));

    let mut child = python(
        "import time; time.sleep(0.3); b = bytearray(512*1024*1024); \
         b[::4096] = b'x'*len(b[::4096]); print('survived')",
    )
    .spawn()
    .expect("spawn python3");
    worker.join(child.id()).expect("join worker cgroup");
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    assert_eq!(status.signal(), Some(9), "expected SIGKILL, got {status:?}");
    assert!(
        worker.oom_kills() >= 1,
        "oom_kills = {}",
        worker.oom_kills()
    );

    let (run_path, worker_path) = (run.path().to_path_buf(), worker.path().to_path_buf());
    run.remove();
    assert!(
        !worker_path.exists(),
        "{} still exists",
        worker_path.display()
    );
    assert!(!run_path.exists(), "{} still exists", run_path.display());
}

#[test]
fn a_worker_under_its_limit_exits_normally_with_no_oom_kill() {
    let Some(enforcement) = cgroup_or_skip("under-limit test") else {
        return;
    };
    let Some(run) = run_or_skip(&enforcement, "under-limit-test") else {
        return;
    };
    let worker = run
        .create_worker("rank-0", 256 * MIB)
        .expect("create worker");
    let mut child = python(
        "import time; time.sleep(0.3); b = bytearray(16*1024*1024); \
         b[::4096] = b'x'*len(b[::4096])",
    )
    .spawn()
    .expect("spawn python3");
    worker.join(child.id()).expect("join worker cgroup");
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(worker.oom_kills(), 0);
    let procs = fs::read_to_string(worker.procs_file()).expect("read procs");
    assert!(parse_procs(&procs).is_empty(), "{procs:?}");

    let worker_path = worker.path().to_path_buf();
    worker.remove();
    assert!(!worker_path.exists());
    let run_path = run.path().to_path_buf();
    run.remove();
    assert!(!run_path.exists());
}

#[test]
fn a_worker_can_join_itself_through_its_procs_file() {
    let Some(enforcement) = cgroup_or_skip("join_self test") else {
        return;
    };
    let Some(run) = run_or_skip(&enforcement, "join-self-test") else {
        return;
    };
    let worker = run
        .create_worker("rank-0", 64 * MIB)
        .expect("create worker");
    // `sh` plays the trampoline: it writes its own pid, then execs.
    let script = format!(
        "echo $$ > '{}' && exec sleep 30",
        worker.procs_file().display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sh");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut joined = false;
    while !joined && Instant::now() < deadline {
        let procs = fs::read_to_string(worker.procs_file()).unwrap_or_default();
        joined = parse_procs(&procs).contains(&child.id());
        thread::sleep(Duration::from_millis(10));
    }
    let run_path = run.path().to_path_buf();
    run.remove();
    let status = wait_bounded(&mut child, Duration::from_secs(5));
    assert!(
        joined,
        "pid {} never appeared in the procs file",
        child.id()
    );
    assert_eq!(
        status.signal(),
        Some(9),
        "remove must SIGKILL the worker: {status:?}"
    );
    assert!(!run_path.exists());
    assert!(matches!(
        join_self(&run_path.join("rank-0/cgroup.procs")),
        Err(LimitError::Join { .. })
    ));
}

#[test]
fn sweeping_removes_runs_of_dead_drivers_and_keeps_our_own() {
    let Some(enforcement) = cgroup_or_skip("sweep test") else {
        return;
    };
    let parent = parent_of(&enforcement);
    // i32::MAX is above any pid_max, so no such process exists.
    let stale = parent.join(format!("{DIR_PREFIX}sweep-test-{}", i32::MAX));
    let stale_worker = stale.join("rank-0");
    fs::create_dir(&stale).expect("create stale run");
    fs::create_dir(&stale_worker).expect("create stale worker");
    let leftover = WorkerCgroup {
        path: stale_worker.clone(),
        limit: None,
        hierarchy: Hierarchy::V1,
        tree: Arc::new(Cgroupfs),
    };
    let mut child = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    leftover.join(child.id()).expect("join stale worker");
    let Some(ours) = run_or_skip(&enforcement, "sweep-test") else {
        let _ = child.kill();
        let _ = child.wait();
        remove_tree(&Cgroupfs, &stale);
        return;
    };

    let removed = sweep_stale(parent);
    let status = wait_bounded(&mut child, Duration::from_secs(5));
    let stale_left = stale.exists();
    let ours_left = ours.path().exists();
    ours.remove();
    assert!(removed >= 1, "removed {removed}");
    assert!(!stale_left, "{} was not swept", stale.display());
    assert!(ours_left, "our own run was swept");
    assert_eq!(
        status.signal(),
        Some(9),
        "leftover process must be killed: {status:?}"
    );
}
