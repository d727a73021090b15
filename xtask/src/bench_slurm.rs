//! `cargo xtask bench-slurm [--nodes N]`: N workers (default 4) on N nodes of the Slurm test
//! cluster (`scripts/slurm-env.sh`, brought up with N nodes), each running a trivial task,
//! through `trainyard run --runtime slurm` (which requests the allocation, starts one job
//! step per worker with the rank environment, runs the task and releases the allocation) and
//! through `srun -N N -n N` (which requests the allocation and runs the task once per node),
//! interleaved round by round, with a third command beside them: `srun -N N -n N` of tasks
//! that connect back to a listener of the bench's, wait for a line, run `true` and answer (what
//! Slurm costs a launcher whose workers call home, as trainyard's agents do). Each is timed
//! from its command's start to its exit. It also
//! counts the `srun` processes on the driver's host while a run's tasks run: one per worker
//! (each worker's agent is a job step of its own, and its `srun` is how the driver sees the
//! step). A cluster brought up with other than 4 nodes is brought back to 4 at the end.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 9;
/// The test cluster's size unless `--nodes` says otherwise (the tests' cluster).
const NODES: usize = 4;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let nodes = match args {
        [] => NODES,
        [flag, n] if flag == "--nodes" => n
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| format!("--nodes must be a number from 1 to 64, got `{n}`"))?,
        other => return Err(format!("unknown arguments {other:?}: expected --nodes N")),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    cluster_of(&root, nodes)?;
    let measured = measure(&root, nodes);
    if nodes != NODES {
        cluster_of(&root, NODES)?;
    }
    measured
}

fn measure(root: &Path, nodes: usize) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let n = nodes.to_string();
    let ours_command = |task: &[&str]| {
        let mut command = Command::new(&trainyard);
        command
            .current_dir(root)
            .args(["run", "--runtime", "slurm", "-n", &n, "-s", "STRICT_SPREAD"])
            .args(["-r", "CPU=1,memory=100MiB", "--"])
            .args(task)
            .env("CI", "1");
        command
    };
    let home = CallHome::new(nodes)?;
    let (mut ours, mut theirs, mut called) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        ours.push(crate::bench_e2e::timed(&mut ours_command(&["true"]))?);
        theirs.push(crate::bench_e2e::timed(
            Command::new("srun").current_dir(root).args([
                "-N",
                &n,
                "-n",
                &n,
                "-c",
                "1",
                "--mem=100M",
                "true",
            ]),
        )?);
        called.push(home.run(root)?);
        eprintln!(
            "round {round}: trainyard --runtime slurm {:.3}s  srun -n {n} {:.3}s  srun calling home {:.3}s",
            ours[round - 1].as_secs_f64(),
            theirs[round - 1].as_secs_f64(),
            called[round - 1].as_secs_f64()
        );
    }
    let sruns = sruns_while_tasks_run(ours_command(&["sleep", "3"]))?;
    let (ours, theirs, called) = (
        crate::bench_e2e::median(ours),
        crate::bench_e2e::median(theirs),
        crate::bench_e2e::median(called),
    );
    println!(
        "{nodes} workers on {nodes} Slurm nodes, a trivial task, median of {ROUNDS} interleaved rounds:"
    );
    println!(
        "  trainyard run --runtime slurm -n {nodes}  {:.3}s",
        ours.as_secs_f64()
    );
    println!(
        "  srun -N {nodes} -n {nodes}                      {:.3}s",
        theirs.as_secs_f64()
    );
    println!(
        "  srun -N {nodes} -n {nodes}, tasks calling home  {:.3}s",
        called.as_secs_f64()
    );
    println!(
        "  trainyard / srun = {:.2} (target <= 1.50)",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    println!(
        "  srun processes on the driver's host while the tasks run: {} started by the driver, {} in all",
        sruns.0, sruns.1
    );
    Ok(())
}

/// `srun -N N -n N` of tasks that call home: each connects to a listener of the bench's,
/// waits for a line (sent once all N are in, as a launcher sends a task once its workers are
/// up), runs `true` and answers; timed from `srun`'s start to its exit.
struct CallHome {
    nodes: usize,
    listener: TcpListener,
    /// The task's script, with the listener's address.
    script: String,
}

/// How long a round of [`CallHome`] may wait for its tasks.
const CALL_HOME_WAIT: Duration = Duration::from_secs(30);

impl CallHome {
    fn new(nodes: usize) -> Result<Self, String> {
        let address = address_toward_nodes()?;
        let listener = TcpListener::bind((address, 0)).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let script = format!(
            "exec 3<>/dev/tcp/{address}/{port} && read -r line <&3 && /bin/true && echo done >&3"
        );
        Ok(Self {
            nodes,
            listener,
            script,
        })
    }

    fn run(&self, root: &Path) -> Result<Duration, String> {
        let n = self.nodes.to_string();
        let started = Instant::now();
        let mut srun = Command::new("srun")
            .current_dir(root)
            .args(["-N", &n, "-n", &n, "-c", "1", "--mem=100M", "bash", "-c"])
            .arg(&self.script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run srun: {e}"))?;
        let called = self.serve();
        let status = srun.wait().map_err(|e| e.to_string())?;
        let elapsed = started.elapsed();
        called?;
        if !status.success() {
            return Err(format!("srun of the calling tasks failed ({status})"));
        }
        Ok(elapsed)
    }

    /// Takes every task's connection, then sends each its line and reads its answer.
    fn serve(&self) -> Result<(), String> {
        let deadline = Instant::now() + CALL_HOME_WAIT;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let mut tasks = Vec::new();
        while tasks.len() < self.nodes {
            match self.listener.accept() {
                Ok((stream, _)) => tasks.push(stream),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "{} of {} tasks called home",
                            tasks.len(),
                            self.nodes
                        ));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        for task in &mut tasks {
            task.set_nonblocking(false).map_err(|e| e.to_string())?;
            task.set_read_timeout(Some(CALL_HOME_WAIT))
                .map_err(|e| e.to_string())?;
            task.write_all(b"go\n").map_err(|e| e.to_string())?;
        }
        for task in tasks {
            let mut answer = String::new();
            BufReader::new(task)
                .read_line(&mut answer)
                .map_err(|e| e.to_string())?;
            if answer.trim() != "done" {
                return Err(format!("a task answered {answer:?}"));
            }
        }
        Ok(())
    }
}

/// This host's address as the test cluster's nodes reach it, as the driver finds its own
/// ([`trainyard_sys::net::advertise_toward`] the nodes' addresses).
fn address_toward_nodes() -> Result<IpAddr, String> {
    let out = Command::new("scontrol")
        .args(["-o", "show", "nodes"])
        .output()
        .map_err(|e| format!("cannot run scontrol: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let nodes = text
        .split_whitespace()
        .filter_map(|field| field.strip_prefix("NodeAddr="));
    Ok(trainyard_sys::net::advertise_toward(nodes))
}

/// The `srun` processes while `run` (a run of a task of seconds) runs, sampled every 50 ms
/// (the median of the samples with any, leaving out the moments of launch and shutdown):
/// those the driver started (one per job step it launched), and all of them on this host
/// (each `srun` forks a helper of its own).
fn sruns_while_tasks_run(mut run: Command) -> Result<(usize, usize), String> {
    let mut child = run
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run trainyard: {e}"))?;
    let driver = child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut started, mut all) = (Vec::new(), Vec::new());
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        let parents = Command::new("ps")
            .args(["-o", "ppid=", "-C", "srun"])
            .output()
            .map_err(|e| format!("cannot run ps: {e}"))?;
        let parents = String::from_utf8_lossy(&parents.stdout);
        let parents: Vec<&str> = parents.split_whitespace().collect();
        if !parents.is_empty() {
            started.push(parents.iter().filter(|p| **p == driver).count());
            all.push(parents.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the counted run failed ({status})"));
    }
    let median = |mut counts: Vec<usize>| {
        counts.sort_unstable();
        counts.get(counts.len() / 2).copied().unwrap_or(0)
    };
    Ok((median(started), median(all)))
}

/// Brings the Slurm test cluster up (`scripts/slurm-env.sh`), or says why it is not.
pub(crate) fn cluster_up(root: &Path) -> Result<(), String> {
    cluster_of(root, NODES)
}

/// Brings the Slurm test cluster up with `nodes` nodes (reconfigured when it has others).
fn cluster_of(root: &Path, nodes: usize) -> Result<(), String> {
    let up = Command::new("bash")
        .arg(root.join("scripts/slurm-env.sh"))
        .env("TRAINYARD_SLURM_NODES", nodes.to_string())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run scripts/slurm-env.sh: {e}"))?;
    if !up.success() {
        return Err(format!("scripts/slurm-env.sh failed ({up})"));
    }
    Ok(())
}
