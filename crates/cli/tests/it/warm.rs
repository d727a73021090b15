//! `trainyard run --warm-python`: Python ranks started as forks of one interpreter that
//! imported the given modules first, through the built binary. The driver itself carries
//! the sandbox's marker, so that the warm Python (which inherits the driver's environment)
//! and the ranks forked from it are found should any be left behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{MARKER, Sandbox, left_behind, root, torch_python, wait_bounded};
use trainyard_test_support::processes as common;

fn run(sandbox: &Sandbox, args: &[&str], program: &[&str]) -> Output {
    run_with(sandbox, &[], args, program)
}

/// [`run`] with `env` in the driver's environment too (the warm Python's).
fn run_with(sandbox: &Sandbox, env: &[(&str, &Path)], args: &[&str], program: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .current_dir(root())
        .envs(env.iter().copied())
        .arg("run")
        .args(args)
        .arg("--")
        .args(program)
        .envs(sandbox.env())
        .env(MARKER, sandbox.mark())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    wait_bounded(child, Duration::from_secs(120))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether the run's ranks could start warm: not where workers get no cgroup (a rank says
/// so, and starts cold), which is a loud `SKIP:` outside CI and a failure under `CI=true`,
/// where the tests run as root with cgroups.
fn forked_here(stderr: &str) -> bool {
    if !no_cgroups_here(stderr) {
        return true;
    }
    assert!(
        std::env::var("CI").ok().as_deref() != Some("true"),
        "under CI=true workers get cgroups, and ranks start warm: {stderr}"
    );
    eprintln!("SKIP: workers get no cgroup on this machine, so their ranks start cold");
    false
}

/// Whether a rank of the local runtime said it starts cold because its worker got no cgroup
/// (with a memory limit: an address-space cap instead).
pub(crate) fn no_cgroups_here(output: &str) -> bool {
    output.contains("has no cgroup to find what a forked rank leaves behind through")
        || output.contains("capped by its address space, which a forked rank would share")
}

fn assert_nothing_left(sandbox: &Sandbox) {
    let left = left_behind(sandbox.mark(), Duration::from_secs(5));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// What each rank prints: whether its module was imported before its first line ran, who
/// its parent is, its rank and attempt, its argv, working directory and first path entry.
const PROBE: &str = r#"
import os, sys
preloaded = "sqlite3" in sys.modules
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    parent = f.read().split(b"\0")
warm_parent = any(arg.endswith(b"/warm.py") for arg in parent)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"probe rank={os.environ['RANK']} attempt={attempt} preloaded={preloaded} warm_parent={warm_parent} argv={sys.argv[1:]} cwd={os.getcwd()} path0={sys.path[0]} main={__name__}")
print(f"to stderr {os.environ['RANK']}", file=sys.stderr)
if attempt == "0" and os.environ["RANK"] == "1":
    sys.exit(3)
"#;

/// The probe as a script file in `dir`.
fn probe_script(dir: &Path) -> PathBuf {
    let script = dir.join("probe.py");
    std::fs::write(&script, PROBE).expect("write the probe");
    script
}

#[test]
fn ranks_start_as_forks_of_the_warm_python_across_a_restart_and_nothing_is_left() {
    let sandbox = Sandbox::new("warm");
    let dir = tempfile::tempdir().expect("a temp dir");
    let script = probe_script(dir.path());
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--max-failures",
            "1",
            "--warm-python",
            "sqlite3",
        ],
        &["python3", script.to_str().expect("UTF-8"), "one", "two"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if !forked_here(&stderr) {
        return;
    }
    assert!(
        stderr.contains("attempt 1 failed (rank 1 exited with code 3"),
        "the exit code comes through the warm Python: {stderr}"
    );
    let cwd = root().canonicalize().expect("the repository");
    for attempt in 0..2 {
        for rank in 0..2 {
            let want = format!(
                "probe rank={rank} attempt={attempt} preloaded=True warm_parent=True argv=['one', 'two'] cwd={} path0={} main=__main__",
                cwd.display(),
                dir.path().canonicalize().expect("the temp dir").display()
            );
            assert!(
                stdout.lines().any(|line| line.ends_with(&want)),
                "no `{want}` in {stdout}"
            );
        }
    }
    for rank in 0..2 {
        assert!(
            stderr
                .lines()
                .any(|line| line.ends_with(&format!(") to stderr {rank}"))),
            "rank {rank}'s stderr comes through: {stderr}"
        );
    }
    assert_nothing_left(&sandbox);
}

#[test]
fn a_warm_rank_over_its_memory_limit_is_reported_as_such() {
    let sandbox = Sandbox::new("warm-memory");
    let out = run(
        &sandbox,
        &[
            "-n",
            "1",
            "-r",
            r#"{"CPU": 0.5, "memory": "64MiB"}"#,
            "--enforce-memory",
            "--warm-python",
            "sqlite3",
        ],
        &["python3", "-c", common::TOUCH_512MIB],
    );
    common::assert_stopped_by_64mib_limit(&out);
    assert_nothing_left(&sandbox);
}

#[test]
fn a_warm_rank_that_raises_shows_its_own_traceback_as_the_root_cause() {
    let sandbox = Sandbox::new("warm-raise");
    let out = run(
        &sandbox,
        &["-n", "1", "-r", "CPU=0.5", "--warm-python", "sqlite3"],
        &[
            "python3",
            "-c",
            "def step():\n    raise ValueError('bad batch')\nstep()",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rank 0 exited with code 1: ValueError: bad batch"),
        "{stderr}"
    );
    // The traceback starts at the program, as a cold interpreter's does.
    let traceback: Vec<&str> = stderr
        .lines()
        .skip_while(|line| !line.ends_with("Traceback (most recent call last):"))
        .take(2)
        .collect();
    assert!(
        traceback
            .get(1)
            .is_some_and(|line| line.ends_with(r#"File "<string>", line 3, in <module>"#)),
        "{traceback:?} in {stderr}"
    );
    assert_nothing_left(&sandbox);
}

#[test]
fn torch_ranks_restart_from_the_warm_python_and_all_reduce_again() {
    let Some(python) = torch_python() else {
        return;
    };
    let sandbox = Sandbox::new("warm-torch");
    let python = python.to_str().expect("UTF-8").to_owned();
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--max-failures",
            "1",
            "--warm-python",
            "torch",
        ],
        &[&python, "crates/cli/tests/python/restart.py"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{stderr}"
    );
    for rank in 0..2 {
        assert!(
            stdout
                .lines()
                .any(|line| line.contains(&format!("first all_reduce 1 {rank} "))),
            "rank {rank} trains again after the restart: {stdout}"
        );
    }
    // Every rank of both attempts found what torch defers to the first optimizer imported.
    let preloaded = |yes: &str| {
        stdout
            .lines()
            .filter(|l| l.ends_with(&format!("torch._dynamo preloaded {yes}")))
            .count()
    };
    assert_eq!((preloaded("True"), preloaded("False")), (4, 0), "{stdout}");
    assert_nothing_left(&sandbox);
}

#[test]
fn a_warm_rank_ends_as_a_cold_one_unbuffered_with_u_and_by_sigint_after_its_exit_handlers() {
    let sandbox = Sandbox::new("warm-end");
    for warm in [false, true] {
        let mut args = vec!["-n", "1", "-r", "CPU=0.5"];
        if warm {
            args.extend(["--warm-python", "sqlite3"]);
        }
        // `-u`: a line printed just before a SIGKILL is not lost in a buffer.
        let out = run(
            &sandbox,
            &args,
            &[
                "python3",
                "-u",
                "-c",
                "import os\nprint('unbuffered')\nos.kill(os.getpid(), 9)",
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            stdout.contains(") unbuffered"),
            "warm {warm}: {stdout}\n{stderr}"
        );
        assert!(
            stderr.contains("rank 0 was killed by signal 9 (SIGKILL)"),
            "{stderr}"
        );
        // An uncaught KeyboardInterrupt: exit handlers run, then the end is by SIGINT.
        let out = run(
            &sandbox,
            &args,
            &[
                "python3",
                "-c",
                "import atexit\natexit.register(lambda: print('exit handler ran'))\nraise KeyboardInterrupt",
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            stdout.contains(") exit handler ran"),
            "warm {warm}: {stdout}\n{stderr}"
        );
        assert!(
            stderr.contains("rank 0 was killed by signal 2 (SIGINT)"),
            "warm {warm}: {stderr}"
        );
    }
    assert_nothing_left(&sandbox);
}

/// One rank running `program`, whose warm Python imports `module`, a module of this test's
/// own with `source`.
fn run_warm_with_module(sandbox: &Sandbox, module: &str, source: &str, program: &[&str]) -> Output {
    let modules = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(modules.path().join(format!("{module}.py")), source).expect("write the module");
    run_with(
        sandbox,
        &[("PYTHONPATH", modules.path())],
        &["-n", "1", "-r", "CPU=0.5", "--warm-python", module],
        program,
    )
}

#[test]
fn a_rank_starts_cold_when_the_warm_python_is_still_importing_after_the_patience() {
    let sandbox = Sandbox::new("warm-slow-import");
    let out = run_warm_with_module(
        &sandbox,
        "slow_to_import",
        "import time\ntime.sleep(120)\n",
        &[
            "python3",
            "-c",
            "import sys\nprint(f'preloaded={\"slow_to_import\" in sys.modules}')",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if !forked_here(&stderr) {
        return;
    }
    assert!(stdout.contains(") preloaded=False"), "{stdout}");
    assert!(
        stderr.contains(
            "--warm-python: the warm Python had not imported its modules after 30 s; this rank starts cold"
        ),
        "{stderr}"
    );
    assert_nothing_left(&sandbox);
}

#[test]
fn a_rank_starts_cold_at_once_when_the_warm_python_dies_while_importing() {
    let sandbox = Sandbox::new("warm-dies-importing");
    let started = std::time::Instant::now();
    let out = run_warm_with_module(
        &sandbox,
        "ends_its_importer",
        "import os\nos._exit(3)\n",
        &["python3", "-c", "print('ran')"],
    );
    let took = started.elapsed();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if !forked_here(&stderr) {
        return;
    }
    assert!(stdout.contains(") ran"), "{stdout}");
    assert!(
        stderr.contains(
            "--warm-python: the warm Python ended before it had imported its modules; this rank starts cold"
        ),
        "{stderr}"
    );
    // Not after the patience for a slow import.
    assert!(took < Duration::from_secs(20), "took {took:?}\n{stderr}");
    assert_nothing_left(&sandbox);
}

#[test]
fn ranks_start_cold_once_the_warm_python_is_gone() {
    let sandbox = Sandbox::new("warm-gone");
    // The first attempt's rank kills the warm Python, its parent: it dies with it, and the
    // next attempt's rank starts cold.
    let out = run(
        &sandbox,
        &[
            "-n",
            "1",
            "-r",
            "CPU=0.5",
            "--max-failures",
            "1",
            "--warm-python",
            "sqlite3",
        ],
        &[
            "python3",
            "-c",
            "import os, sys, time\nattempt = os.environ['TORCHELASTIC_RESTART_COUNT']\nprint(f'attempt {attempt} preloaded={\"sqlite3\" in sys.modules}', flush=True)\nif attempt == '0':\n    os.kill(os.getppid(), 9)\n    time.sleep(30)",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if !forked_here(&stderr) {
        return;
    }
    assert!(stdout.contains(") attempt 0 preloaded=True"), "{stdout}");
    assert!(stdout.contains(") attempt 1 preloaded=False"), "{stdout}");
    assert!(
        stderr.contains("the warm Python ended before the task"),
        "{stderr}"
    );
    assert!(stderr.contains("; this rank starts cold"), "{stderr}");
    assert_nothing_left(&sandbox);
}

#[test]
fn the_warm_python_outlives_what_a_scheduler_sends_every_process_of_a_step() {
    let sandbox = Sandbox::new("warm-signals");
    // The rank sends its parent, the warm Python, what slurmstepd sends every process of a
    // step at a cancel or a `--signal` warning: the warm Python (and so the rank: it would
    // die with it) is still there, and the rank's own dispositions are the defaults.
    let out = run(
        &sandbox,
        &["-n", "1", "-r", "CPU=0.5", "--warm-python", "sqlite3"],
        &[
            "python3",
            "-c",
            "import os, signal, sys, time
parent = os.getppid()
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
    os.kill(parent, s)
time.sleep(0.5)
alive = os.getppid() == parent
defaults = all(signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP))
print(f'preloaded={\"sqlite3\" in sys.modules} alive={alive} defaults={defaults}', flush=True)",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if !forked_here(&stderr) {
        return;
    }
    assert!(
        stdout.contains(") preloaded=True alive=True defaults=True"),
        "{stdout}\n{stderr}"
    );
    assert_nothing_left(&sandbox);
}

/// What each rank prints on Ray and Slurm, where each agent starts a warm Python of its own:
/// whether the rank is a fork of a warm Python that imported `sqlite3`, and that Python's
/// parent (the rank's agent). Rank 1 exits 3 in attempt 0.
const AGENTS_PROBE: &str = r#"
import os, sys
preloaded = "sqlite3" in sys.modules
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    warm_parent = any(arg.endswith(b"/warm.py") for arg in f.read().split(b"\0"))
with open(f"/proc/{os.getppid()}/stat") as f:
    agent = f.read().rsplit(")", 1)[1].split()[1]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"probe rank={os.environ['RANK']} attempt={attempt} preloaded={preloaded} warm_parent={warm_parent} agent={agent}")
if attempt == "0" and os.environ["RANK"] == "1":
    sys.exit(3)
"#;

/// [`AGENTS_PROBE`] as a script file in `dir`, for `--warm-python sqlite3 --max-failures 1`.
pub(crate) fn agents_probe(dir: &Path) -> PathBuf {
    let script = dir.join("agents_probe.py");
    std::fs::write(&script, AGENTS_PROBE).expect("write the probe");
    script
}

/// Both attempts of an [`agents_probe`] run on 2 ranks started every rank as a fork of a warm
/// Python whose parent is the rank's agent as the record of the run in folder `run` has it, and the restart
/// kept the agents (and so their warm Pythons).
pub(crate) fn assert_warm_in_kept_agents(stdout: &str, run: &Path) {
    let record = &trainyard_test_support::hosts::record(run);
    let agents = common::agent_pids(record, 0);
    assert_eq!(agents.len(), 2, "{record}");
    assert_eq!(
        agents,
        common::agent_pids(record, 1),
        "the agents are the same after the restart: {record}"
    );
    for attempt in 0..2 {
        for (rank, agent) in agents.iter().enumerate() {
            let want = format!(
                "probe rank={rank} attempt={attempt} preloaded=True warm_parent=True agent={agent}"
            );
            assert!(
                stdout.lines().any(|line| line.ends_with(&want)),
                "no `{want}` in {stdout}"
            );
        }
    }
}
