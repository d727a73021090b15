//! The agent as a process, driven over its wire protocol the way the hub drives it: the
//! stacks it captures of a running task, and the root cause it sends before a failed exit.
//! The agent is this test binary, started again to run only [`agent_entry`].
//!
//! The Python tests need `python3` (and, for py-spy's frames and torch's `@record`, the
//! project's venv: `TRAINYARD_TORCH_PYTHON` or `scripts/python-env.sh`); without them a test
//! says `SKIP:` and passes, and under `CI=true` it fails instead, unless CI said why
//! (`TRAINYARD_TORCH_SKIP`).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};
use trainyard_agent::PY_SPY;
use trainyard_runtime::root_cause::ERROR_FILE_VAR;
use trainyard_runtime::root_cause::{ErrorSource, TaskError};
use trainyard_runtime::stacks::{ProcessStacks, TaskStacks, ThreadStack};
use trainyard_runtime::{
    ActorId, FunctionRegistry, Request, Response, TaskEvent, TaskExit, TaskSpec,
};
use trainyard_test_support::processes::{TORCH_SKIP, torch_python};
use trainyard_wire::auth::Handshake;
use trainyard_wire::config::AgentConfig;
use trainyard_wire::testing;
use trainyard_wire::token::{Nonce, Role, Token};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage, WireError};

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(120);
/// The bound of one wait for the agent: a task's first `import torch` on a loaded machine,
/// its libraries not in the page cache after a build, took more than 30 s in CI.
const WAIT: Duration = Duration::from_secs(90);

/// A function that reports once (and yields, so that the report goes out), then blocks its
/// thread (never awaiting) for 600 s.
const BLOCK: &str = "test.block";
/// A function that fails.
const FAIL: &str = "test.fail";

/// Serves as an agent when started by a test of this file; does nothing otherwise.
/// The full name of [`agent_entry`] in this binary, as `--exact` takes it.
const AGENT_ENTRY: &str = "agent::agent_entry";

#[test]
fn agent_entry() {
    if let Some(code) = trainyard_agent::run_if_agent(functions()) {
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
}

/// The functions the agents of these tests serve besides the built-ins.
fn functions() -> FunctionRegistry {
    FunctionRegistry::new()
        .register(BLOCK, |ctx| async move {
            ctx.report(serde_json::Map::new());
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_secs(600));
            Ok(serde_json::Value::Null)
        })
        .register(
            FAIL,
            |_ctx| async move { Err("broken on purpose".to_owned()) },
        )
}

/// An agent started by the test, and its connection.
struct Driver {
    link: wire::Link<TcpStream>,
    agent: Child,
    /// The agent's process id.
    pid: u32,
    next_id: u64,
    /// Events read while waiting for a reply.
    events: VecDeque<AgentMessage>,
}

impl Driver {
    /// Starts this binary as an agent and takes its hello; grants it ample credit.
    async fn start() -> Self {
        Self::start_with(|config| config).await
    }

    /// [`Driver::start`], with the agent's configuration changed by `change`.
    async fn start_with(change: impl FnOnce(AgentConfig) -> AgentConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let config = change(AgentConfig {
            grace_ms: 2_000,
            ..testing::local_agent_config(
                listener.local_addr().expect("an address").to_string(),
                ActorId(0),
            )
        });
        let token = Token::random().expect("randomness");
        let agent = testing::start_agent(AGENT_ENTRY, &config, &token, Stdio::inherit()).await;
        let (socket, _) = timeout(WAIT, listener.accept())
            .await
            .expect("the agent connects in time")
            .expect("accepted");
        let mut link = wire::framed(socket);
        let frame = link.next().await.expect("a hello").expect("a frame");
        let AgentMessage::Hello {
            actor, pid, nonce, ..
        } = wire::decode(&frame).expect("a message")
        else {
            panic!("the agent did not say hello first");
        };
        let handshake = Handshake {
            agent_nonce: nonce,
            driver_nonce: Nonce::random().expect("randomness"),
            actor,
            pid,
        };
        let challenge = DriverMessage::Challenge {
            nonce: handshake.driver_nonce,
            proof: handshake.prove(&token, Role::Driver),
        };
        link.send(wire::encode(&challenge).expect("encodable"))
            .await
            .expect("the challenge is sent");
        let frame = link.next().await.expect("a proof").expect("a frame");
        let AgentMessage::Proof { proof } = wire::decode(&frame).expect("a message") else {
            panic!("the agent did not answer the challenge");
        };
        handshake
            .verify(&token, Role::Agent, &proof)
            .expect("the agent proves it holds the token");
        wire::authenticated(&mut link, &handshake.session_key(&token), Role::Driver);
        let mut driver = Self {
            link,
            agent,
            pid,
            next_id: 0,
            events: VecDeque::new(),
        };
        driver
            .send(&DriverMessage::Credit {
                events: 1_000_000,
                bytes: 1 << 40,
            })
            .await;
        driver
    }

    async fn send(&mut self, message: &DriverMessage) {
        let frame = wire::encode(message).expect("encodable");
        self.link.send(frame).await.expect("sent to the agent");
    }

    /// The next message of the agent other than a heartbeat.
    async fn read(&mut self) -> AgentMessage {
        loop {
            let frame = timeout(WAIT, self.link.next())
                .await
                .expect("the agent says something in time")
                .expect("the agent is still connected")
                .expect("a frame");
            match wire::decode(&frame).expect("a message") {
                AgentMessage::Heartbeat => {}
                message => return message,
            }
        }
    }

    /// Sends `request` and waits (within [`WAIT`]) for its answer, keeping the events that
    /// come first.
    async fn call(&mut self, request: Request) -> Result<Response, WireError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&DriverMessage::Request { id, request }).await;
        let answer = async {
            loop {
                match self.read().await {
                    AgentMessage::Reply {
                        id: replied,
                        result,
                    } if replied == id => {
                        return result;
                    }
                    event => self.events.push_back(event),
                }
            }
        };
        timeout(WAIT, answer)
            .await
            .expect("the agent answers in time")
    }

    /// The next event of the task.
    async fn next_event(&mut self) -> AgentMessage {
        match self.events.pop_front() {
            Some(event) => event,
            None => self.read().await,
        }
    }

    /// Reads events until one matches `wanted` (within [`WAIT`]); returns it, and everything
    /// read before it.
    async fn event_until(
        &mut self,
        wanted: impl Fn(&AgentMessage) -> bool,
    ) -> (AgentMessage, Vec<AgentMessage>) {
        let mut before = Vec::new();
        let found = async {
            loop {
                let event = self.next_event().await;
                if wanted(&event) {
                    return event;
                }
                before.push(event);
            }
        };
        let event = timeout(WAIT, found).await.unwrap_or_else(|_| {
            panic!("no such event within {WAIT:?}");
        });
        (event, before)
    }

    /// Starts `program` with `args` and `env` as the task.
    async fn run_command(&mut self, program: &str, args: &[&str], env: &[(&str, &str)]) -> u32 {
        let task = TaskSpec::Command {
            program: program.to_owned(),
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
            env: env
                .iter()
                .map(|&(key, value)| (key.to_owned(), value.to_owned()))
                .collect(),
        };
        match self
            .call(Request::RunTask {
                attempt: trainyard_runtime::AttemptNumber::default(),
                task,
            })
            .await
        {
            Ok(Response::TaskStarted { pid: Some(pid) }) => pid,
            other => panic!("the command did not start: {other:?}"),
        }
    }

    /// Starts function `name` as the task.
    async fn run_function(&mut self, name: &str) {
        let task = TaskSpec::Function {
            name: name.to_owned(),
            arg: serde_json::Value::Null,
            env: BTreeMap::new(),
        };
        let started = self
            .call(Request::RunTask {
                attempt: trainyard_runtime::AttemptNumber::default(),
                task,
            })
            .await;
        assert_eq!(started, Ok(Response::TaskStarted { pid: None }));
    }

    /// Waits for a line of output that says `text`.
    async fn line(&mut self, text: &str) {
        let (_, _) = self
            .event_until(|event| {
                matches!(event, AgentMessage::Event { event: TaskEvent::Log { line, .. }, .. }
                    if line.contains(text))
            })
            .await;
    }

    /// The task's stacks, and how long the agent took to answer.
    async fn stacks(&mut self) -> (TaskStacks, Duration) {
        let asked = Instant::now();
        match self.call(Request::Stacks).await {
            Ok(Response::Stacks(stacks)) => (stacks, asked.elapsed()),
            other => panic!("no stacks: {other:?}"),
        }
    }

    /// Asks for the stacks until `ready` says they show what the test waits for (a process
    /// that has reached its wait), within [`WAIT`].
    async fn stacks_when(&mut self, ready: impl Fn(&TaskStacks) -> bool) -> TaskStacks {
        let deadline = Instant::now() + WAIT;
        loop {
            let (stacks, _) = self.stacks().await;
            if ready(&stacks) {
                return stacks;
            }
            assert!(
                Instant::now() < deadline,
                "the stacks never showed what was expected:\n{stacks}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// The failed exit's root cause: the `RootCause` event, checked to come right before
    /// the failed `TaskExited`.
    async fn root_cause(&mut self) -> (u64, Option<TaskError>) {
        let (cause, _) = self
            .event_until(|event| {
                matches!(
                    event,
                    AgentMessage::Event {
                        event: TaskEvent::RootCause { .. },
                        ..
                    }
                )
            })
            .await;
        let exit = self.next_event().await;
        assert!(
            matches!(
                exit,
                AgentMessage::TaskExited {
                    exit: TaskExit::Failed { .. },
                    ..
                }
            ),
            "the failed exit follows its root cause: {exit:?}"
        );
        match cause {
            AgentMessage::Event {
                event: TaskEvent::RootCause { ended_ms, error },
                ..
            } => (ended_ms, error),
            _ => unreachable!("matched above"),
        }
    }

    /// Stops the agent and waits for it to exit.
    async fn stop(mut self) {
        let stopped = self.call(Request::Stop).await;
        assert_eq!(stopped, Ok(Response::Done));
        let status = timeout(WAIT, self.agent.wait())
            .await
            .expect("the agent exits in time")
            .expect("reaped");
        assert!(status.success(), "the agent exited with {status}");
    }
}

/// Says why a test cannot run: `SKIP:`, or under `CI=true` (unless CI said why) a failure.
fn cannot_run(why: &str) {
    let known = std::env::var(TORCH_SKIP).is_ok_and(|why| !why.is_empty());
    assert!(
        known || !std::env::var("CI").is_ok_and(|ci| ci == "true"),
        "under CI=true the Python tests run: {why}"
    );
    println!("SKIP: {why}");
}

/// `python3` on `PATH`, when it runs.
async fn python3() -> Option<&'static str> {
    let runs = Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|status| status.success());
    if !runs {
        cannot_run("python3 is not on PATH");
    }
    runs.then_some("python3")
}

/// The py-spy the agent will use for `python`: [`PY_SPY`], else the one beside it.
fn py_spy_for(python: &Path) -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os(PY_SPY).filter(|path| !path.is_empty()) {
        return Some(PathBuf::from(explicit));
    }
    python
        .parent()
        .map(|bin| bin.join("py-spy"))
        .filter(|py_spy| py_spy.is_file())
}

/// The process `pid` of `stacks`.
fn process(stacks: &TaskStacks, pid: u32) -> &ProcessStacks {
    stacks
        .processes
        .iter()
        .find(|process| process.pid == pid)
        .unwrap_or_else(|| panic!("no process {pid} in:\n{stacks}"))
}

/// Whether a thread sleeps in the kernel (`S`, waiting in a `*sleep*` function).
fn asleep(thread: &ThreadStack) -> bool {
    thread.state == "S" && thread.wchan.as_deref().is_some_and(|w| w.contains("sleep"))
}

/// Runs `test` within [`TEST_LIMIT`].
async fn bounded(test: impl Future<Output = ()>) {
    timeout(TEST_LIMIT, test)
        .await
        .expect("the test ends within its limit");
}

#[tokio::test]
async fn a_sleeping_python_task_shows_its_kernel_wait_and_with_py_spy_its_frames() {
    bounded(async {
        let Some(python) = torch_python() else {
            return;
        };
        let py_spy = py_spy_for(&python);
        if py_spy.is_none() {
            cannot_run(&format!(
                "py-spy is not beside {} (scripts/python-env.sh installs it): checking the \
                 kernel's view only",
                python.display()
            ));
        }
        let mut driver = Driver::start().await;
        let script = "import threading, time\n\
                      threading.Thread(target=time.sleep, args=(600,), name='loader').start()\n\
                      print('sleeping', flush=True)\n\
                      time.sleep(600)\n";
        let program = python.to_string_lossy();
        let pid = driver.run_command(&program, &["-c", script], &[]).await;
        driver.line("sleeping").await;
        let with_frames = py_spy.is_some();
        let stacks = driver
            .stacks_when(|stacks| {
                stacks.processes.first().is_some_and(|p| {
                    p.threads.first().is_some_and(|main| {
                        asleep(main)
                            && (!with_frames
                                || main.frames.iter().any(|f| f.function.contains("sleep")))
                    })
                })
            })
            .await;
        let (again, took) = driver.stacks().await;
        println!("one Python process: Stacks answered in {took:?}\n{again}");
        assert!(took < Duration::from_secs(3), "{took:?}");

        let task = &stacks.processes[0];
        assert_eq!(task.pid, pid, "the task's process comes first:\n{stacks}");
        assert!(task.command.contains("time.sleep(600)"), "{}", task.command);
        let main = &task.threads[0];
        assert_eq!(main.tid, pid, "the main thread comes first:\n{stacks}");
        if with_frames {
            assert_eq!(main.name, "MainThread", "{stacks}");
            let functions: Vec<&str> = main.frames.iter().map(|f| f.function.as_str()).collect();
            assert!(functions.contains(&"<module>"), "{stacks}");
            assert!(
                functions.iter().any(|f| f.contains("sleep")),
                "--native shows the C frames of time.sleep:\n{stacks}"
            );
            let loader = task.threads.iter().find(|t| t.name == "loader");
            assert!(
                loader.is_some_and(|t| t.tid != pid && !t.frames.is_empty()),
                "Python's other thread, by its name:\n{stacks}"
            );
            assert!(stacks.notes.is_empty(), "{stacks}");
        } else {
            assert!(main.frames.is_empty());
            assert!(
                stacks
                    .notes
                    .iter()
                    .any(|n| n.contains("pip install py-spy")),
                "{stacks}"
            );
        }
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_shell_task_shows_the_shell_and_its_child_with_their_states() {
    bounded(async {
        let mut driver = Driver::start().await;
        let pid = driver
            .run_command("sh", &["-c", "sleep 600; exit 0"], &[])
            .await;
        let stacks = driver
            .stacks_when(|stacks| {
                // Both have reached their wait: sh in wait4, sleep in nanosleep.
                stacks.processes.len() == 2
                    && stacks.processes[0]
                        .threads
                        .first()
                        .is_some_and(|t| t.state == "S")
                    && stacks.processes[1].command.starts_with("sleep")
                    && stacks.processes[1].threads.first().is_some_and(asleep)
            })
            .await;
        let shell = &stacks.processes[0];
        assert_eq!(shell.pid, pid, "the task's own process first:\n{stacks}");
        assert!(
            shell.command.ends_with("sh -c sleep 600; exit 0"),
            "{}",
            shell.command
        );
        assert_eq!(shell.threads[0].name, "sh");
        assert_eq!(
            shell.threads[0].state, "S",
            "sh waits for its child:\n{stacks}"
        );
        let sleep = &stacks.processes[1];
        assert_eq!(sleep.command, "sleep 600");
        assert_eq!(sleep.threads[0].tid, sleep.pid);
        assert!(stacks.notes.is_empty(), "{stacks}");
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_blocked_function_task_shows_its_thread_first_and_asleep() {
    bounded(async {
        let mut driver = Driver::start().await;
        let (idle, _) = driver.stacks().await;
        assert!(idle.processes.is_empty());
        assert_eq!(idle.notes, vec!["no task runs".to_owned()]);

        driver.run_function(BLOCK).await;
        driver
            .event_until(|event| {
                matches!(
                    event,
                    AgentMessage::Event {
                        event: TaskEvent::Report { .. },
                        ..
                    }
                )
            })
            .await;
        let stacks = driver
            .stacks_when(|stacks| {
                stacks
                    .processes
                    .first()
                    .and_then(|agent| agent.threads.first())
                    .is_some_and(asleep)
            })
            .await;
        let agent = process(&stacks, driver.pid);
        assert_eq!(stacks.processes.len(), 1, "{stacks}");
        let first = &agent.threads[0];
        assert_eq!(first.name, "trainyard-task", "{stacks}");
        assert_eq!(first.state, "S");
        assert!(
            agent.threads.iter().any(|t| t.tid == agent.pid),
            "the agent's main thread is there too:\n{stacks}"
        );
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_failed_function_task_sends_a_root_cause_without_an_exception() {
    bounded(async {
        let mut driver = Driver::start().await;
        let before = now_ms();
        driver.run_function(FAIL).await;
        let (ended_ms, error) = driver.root_cause().await;
        assert_eq!(error, None);
        assert!(ended_ms >= before && ended_ms <= now_ms(), "{ended_ms}");
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_failed_python_task_without_an_error_file_is_explained_by_its_last_traceback() {
    bounded(async {
        let Some(python) = python3().await else {
            return;
        };
        let mut driver = Driver::start().await;
        let before = now_ms();
        let script = "print('step 1', flush=True)\nraise ValueError('bad batch')";
        driver.run_command(python, &["-c", script], &[]).await;
        let (ended_ms, error) = driver.root_cause().await;
        let error = error.expect("the traceback of the output");
        assert_eq!(error.source, ErrorSource::Output);
        assert_eq!(
            (error.exception.as_str(), error.message.as_str()),
            ("ValueError", "bad batch")
        );
        assert_eq!(error.file.as_deref(), Some("<string>"));
        assert!(ended_ms >= before && ended_ms <= now_ms(), "{ended_ms}");
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_failed_torch_task_is_explained_by_the_error_file_record_wrote() {
    bounded(async {
        let Some(python) = torch_python() else {
            return;
        };
        let mut driver = Driver::start().await;
        let script = "from torch.distributed.elastic.multiprocessing.errors import record\n\
                      @record\n\
                      def main():\n    raise ValueError('bad batch')\n\
                      main()\n";
        let env = [(ERROR_FILE_VAR, "TORCHELASTIC_ERROR_FILE")];
        driver
            .run_command(&python.to_string_lossy(), &["-c", script], &env)
            .await;
        let (_, error) = driver.root_cause().await;
        let error = error.expect("the error file's record");
        assert_eq!(error.source, ErrorSource::ErrorFile, "{error:?}");
        assert_eq!(error.to_string(), "ValueError: bad batch (<string>:4)");
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn an_error_file_the_task_names_itself_is_used_as_it_is() {
    bounded(async {
        let Some(python) = python3().await else {
            return;
        };
        let dir = tempfile::tempdir().expect("a temp dir");
        let mine = dir.path().join("mine.json");
        let mut driver = Driver::start().await;
        // Torch's format, written by hand; the output has no traceback.
        let script = "import json, os, sys\n\
                      record = {'message': {'message': 'RuntimeError: from my file', \
                      'extraInfo': {'py_callstack': '', 'timestamp': '0'}}}\n\
                      json.dump(record, open(os.environ['MY_ERRORS'], 'w'))\n\
                      sys.exit(3)\n";
        let mine_text = mine.to_string_lossy();
        let env = [(ERROR_FILE_VAR, "MY_ERRORS"), ("MY_ERRORS", &*mine_text)];
        driver.run_command(python, &["-c", script], &env).await;
        let (_, error) = driver.root_cause().await;
        let error = error.expect("the task's own error file");
        assert_eq!(error.source, ErrorSource::ErrorFile);
        assert_eq!(error.to_string(), "RuntimeError: from my file");
        assert!(mine.is_file(), "written where the task said");
        driver.stop().await;
    })
    .await;
}

/// Now, in ms since the Unix epoch.
fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

/// Whether a process whose argv is `sleep <marker>` is alive.
fn sleeping(marker: &str) -> Vec<u32> {
    let wanted = format!("sleep\0{marker}\0");
    trainyard_sys::procfs::pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|argv| argv == wanted.as_bytes())
                && trainyard_sys::procfs::is_alive(*pid, None)
        })
        .collect()
}

#[tokio::test]
async fn a_tasks_child_cannot_join_the_agents_group_and_outlive_the_task() {
    bounded(async {
        let Some(python) = python3().await else {
            return;
        };
        let marker = format!("1000.{}3", std::process::id());
        let script = format!(
            "import os\n\
             print('own session', os.getsid(0) == os.getpid(), flush=True)\n\
             group = os.getpgid(os.getppid())\n\
             if os.fork() == 0:\n\
             \x20   try:\n\
             \x20       os.setpgid(0, group)\n\
             \x20       print('joined', flush=True)\n\
             \x20   except OSError as error:\n\
             \x20       print('refused', error.errno, flush=True)\n\
             \x20   os.execvp('sleep', ['sleep', '{marker}'])\n"
        );
        let mut driver = Driver::start().await;
        driver.run_command(python, &["-c", &script], &[]).await;
        let (_, before) = driver
            .event_until(|event| matches!(event, AgentMessage::TaskExited { .. }))
            .await;
        let said: Vec<String> = before
            .iter()
            .filter_map(|event| match event {
                AgentMessage::Event {
                    event: TaskEvent::Log { line, .. },
                    ..
                } => Some(line.clone()),
                _ => None,
            })
            .collect();
        // The end is reported only after the sweep: nothing is left to wait for.
        let left = sleeping(&marker);
        for pid in &left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(*pid).unwrap_or(0)),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(left.is_empty(), "the task's child outlived it: {said:?}");
        assert!(
            said.iter().any(|line| line == "own session True"),
            "{said:?}"
        );
        assert!(said.iter().any(|line| line == "refused 1"), "{said:?}");
        driver.stop().await;
    })
    .await;
}

#[tokio::test]
async fn an_agent_that_hears_nothing_from_its_driver_within_its_bound_stops_its_task_and_exits() {
    bounded(async {
        let marker = format!("1000.{}5", std::process::id());
        let bound = Duration::from_millis(500);
        let mut driver = Driver::start_with(|config| AgentConfig {
            driver_lost_ms: u64::try_from(bound.as_millis()).expect("fits"),
            ..config
        })
        .await;
        let script = format!("exec sleep {marker}");
        // The last the agent hears is the request (or what follows it): its bound runs from
        // no sooner than this.
        let silent = Instant::now();
        driver.run_command("sh", &["-c", &script], &[]).await;
        let deadline = Instant::now() + WAIT;
        while sleeping(&marker).is_empty() {
            assert!(Instant::now() < deadline, "the task never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // From now on the driver says nothing, its connection open: the agent gives it up
        // after its bound, stopping its task first.
        let status = timeout(WAIT, driver.agent.wait())
            .await
            .expect("the agent exits in time")
            .expect("reaped");
        assert!(
            silent.elapsed() >= bound,
            "the agent left a silent driver before its bound: {:?}",
            silent.elapsed()
        );
        assert!(status.success(), "the agent exited with {status}");
        assert!(
            sleeping(&marker).is_empty(),
            "the task outlived the agent that gave up its driver"
        );
    })
    .await;
}
