"""trainyard's bridge to Ray: line-delimited JSON on stdin/stdout, nothing decided here.

Requests on stdin:   {"id": N, "op": "...", "deadline_ms": D, ...args}
Replies on stdout:   {"id": N, "ok": {...}} | {"id": N, "error": {"kind": "...", "message": "..."}}
Events on stdout:    {"event": "ready" | "failed" | "actor_ended", ...}

`deadline_ms` is when the driver stops waiting for the reply (Unix time in milliseconds): work
not started by then is refused (kind "deadline"), blocking Ray calls are bounded by it, and a
spawn that completes past it kills the actor it made, since nobody would hold it. A line that
is not a request object is answered with a "protocol" error, with its id when one can be read
and `null` otherwise. Control requests (kill, signal, remove_pg, actors, ping, shutdown) run on
their own threads, never queued behind spawns and other blocking work.

Ray prints to fd 1 (raylet error lines, autoscaler messages), so the protocol gets a private
duplicate of fd 1 and fd 1 itself becomes stderr before ray is imported. Placement, sizing and
every other decision belong to the Rust driver; this file only translates.
"""

import ctypes
import json
import os
import re
import signal
import sys
import threading
import time

# --- before anything else: a private protocol stream, and fate sharing with the driver -----
proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
_proto_lock = threading.Lock()


def _die_with_parent():
    """SIGKILL this process when the driver dies (Ray then reaps this job's actors and groups)."""
    expected = os.environ.get("TRAINYARD_BRIDGE_PARENT")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception as exc:  # not Linux: EOF on stdin still shuts down cleanly
        print(f"trainyard-bridge: prctl unavailable: {exc}", file=sys.stderr)
    if expected is not None and os.getppid() != int(expected):
        os._exit(70)


_die_with_parent()


def emit(message):
    line = json.dumps(message, separators=(",", ":"))
    with _proto_lock:
        proto.write(line + "\n")
        proto.flush()


def failure(kind, exc_or_message):
    return {"kind": kind, "message": str(exc_or_message)}


def _cause_text(exc):
    parts = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)


try:
    import ray
    import ray.exceptions
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except Exception as exc:  # ray missing or broken
    emit({"event": "failed", "kind": "no_ray", "message": _cause_text(exc)})
    sys.exit(2)

ADDRESS = os.environ.get("TRAINYARD_RAY_ADDRESS") or None
NAMESPACE = os.environ.get("TRAINYARD_RAY_NAMESPACE") or "trainyard"
# How long an actor whose node stopped answering may stay "unavailable" before it is reported
# as ended: Ray marks a lost node dead after about 15 s (3 s health checks x 5), after which the
# wait call raises ActorDiedError (reported as node_died, measured at 15 s); past this bound it
# is reported with kind "unavailable". Set by the Rust side (BridgeConfig::unavailable_grace).
UNAVAILABLE_GRACE_S = float(os.environ.get("TRAINYARD_RAY_UNAVAILABLE_GRACE_S", "30"))
ACCELERATOR_KEYS = ("GPU", "neuron_cores", "TPU", "NPU", "HPU")


def _proc_stat(pid):
    """The fields of `/proc/<pid>/stat` from field 3 (state) on: 4 is the parent, 5 the process
    group, 6 the session, 22 the start time (`fields[19]`); None when the process is gone or
    its line cannot be read (the command name may hold spaces and parentheses: fields are
    counted after the last `)`)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    fields = text[text.rfind(")") + 1 :].split()
    return fields if len(fields) >= 20 else None


def _start_time(pid):
    """When process `pid` started (field 22, clock ticks after boot); None when it is gone."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None else None


@ray.remote
class TrainyardActor:
    """Hosts one trainyard agent process, in this actor's own process group."""

    def __init__(self):
        self.proc = None
        # The agent's start time, read when its pid was learned: with the pid it names the
        # agent for good (a pid alone may be handed out again once the agent is reaped).
        self.agent_start = None

    def start(self, program, args, env, config, token, cwd=None):
        import subprocess

        ctx = ray.get_runtime_context()
        accelerators = ctx.get_accelerator_ids()
        config = dict(config)
        config["parent"] = os.getpid()
        config["node_id"] = ctx.get_node_id()
        config["node_ip"] = ray.util.get_node_ip_address()
        config["accelerator_ids"] = {
            key: [str(v) for v in accelerators.get(key, [])] for key in ACCELERATOR_KEYS
        }
        child_env = dict(os.environ)
        child_env.update(env)
        child_env["TRAINYARD_ROLE"] = "agent"
        child_env["TRAINYARD_AGENT_CONFIG"] = json.dumps(config)
        # Same process group as the actor (no new session): a crashed actor takes the agent along.
        self.proc = subprocess.Popen(
            [program, *args],
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=None,
            # The driver's directory when this node has it (same machine, shared file system).
            cwd=cwd if cwd and os.path.isdir(cwd) else None,
        )
        self.agent_start = _start_time(self.proc.pid)
        try:
            self.proc.stdin.write((token + "\n").encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        return {
            "pid": self.proc.pid,
            "actor_pid": os.getpid(),
            "node_id": config["node_id"],
            "node_ip": config["node_ip"],
            "accelerator_ids": config["accelerator_ids"],
            "assigned": {k: float(v) for k, v in ctx.get_assigned_resources().items()},
        }

    def wait(self):
        return self.proc.wait()

    def ping(self):
        return True

    def signal(self, signum, task_pgid):
        """Sends `signum` to the agent while it is the process started (pid and start time);
        with SIGKILL, first kills process group `task_pgid` while it is one of the agent's
        tasks. Returns whether the agent was signalled."""
        if signum == signal.SIGKILL and task_pgid and self._is_agents_task_group(int(task_pgid)):
            try:
                os.killpg(int(task_pgid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is None or self.proc.poll() is not None or not self._is_the_agent():
            return False
        self.proc.send_signal(signum)
        return True

    def _is_the_agent(self):
        """Whether the agent's pid still names the agent: started when it was recorded, and
        not a zombie (whose pid is still taken, but which a signal no longer reaches)."""
        fields = _proc_stat(self.proc.pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return self.agent_start is None or int(fields[19]) == self.agent_start

    def _is_agents_task_group(self, group):
        """Whether process group `group` is one of the agent's tasks: never this actor's own
        group (the agent is in it) nor init's; its leader, a child of the agent, still leads
        it (a zombie counts: its pid is not free until the agent reaps it); or, its leader
        reaped, a live process of the agent's session is still in it."""
        if group <= 1 or group == os.getpgid(0) or not self._is_the_agent():
            return False
        leader = _proc_stat(group)
        if leader is not None:
            return leader[0] != "X" and int(leader[2]) == group and int(leader[1]) == self.proc.pid
        try:
            session = os.getsid(self.proc.pid)
        except OSError:
            return False
        for entry in os.listdir("/proc"):
            fields = _proc_stat(entry) if entry.isdigit() else None
            if (
                fields is not None
                and fields[0] not in ("Z", "X")
                and int(fields[2]) == group
                and int(fields[3]) == session
            ):
                return True
        return False


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.actors = {}  # name -> {"handle", "state", "pg"}
        self.groups = {}  # hex -> PlacementGroup
        self.closing = False


STATE = State()


class OpError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


# How long before its deadline a reply must be sent to reach the driver while it still waits.
DEADLINE_MARGIN_S = 0.25


def deadline_of(req):
    """The request's deadline (Unix time in seconds), or None when it has none."""
    value = req.get("deadline_ms")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpError("protocol", f"deadline_ms is {value!r}; Unix time in milliseconds is expected")
    return value / 1000.0


def time_left(req, what):
    """Seconds left to work on the request before its reply must be sent; raises the
    `deadline` error when none are (the driver stopped waiting, or is about to)."""
    deadline = deadline_of(req)
    if deadline is None:
        return None
    left = deadline - DEADLINE_MARGIN_S - time.time()
    if left <= 0:
        raise OpError(
            "deadline",
            f"{what} is past its deadline by {-left:.3f} s: the driver no longer waits for it",
        )
    return left


def bounded(req, what, seconds):
    """`seconds`, cut short by the request's deadline."""
    left = time_left(req, what)
    return seconds if left is None else min(seconds, left)


def classify(exc):
    """The error kind the Rust side matches on."""
    if isinstance(exc, OpError):
        return exc.kind
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return "timeout"
    if isinstance(exc, getattr(ray.exceptions, "ActorAlreadyExistsError", ())):
        return "name_taken"
    if isinstance(exc, ray.exceptions.ActorDiedError):
        return "actor_died"
    if isinstance(exc, ray.exceptions.ActorUnavailableError):
        return "actor_unavailable"
    if isinstance(exc, (ValueError, TypeError)):
        return "invalid"
    return "ray"


# Ray's typed reason for an actor's death (`ActorDiedErrorContext.Reason` in the death cause
# the GCS records for the actor), as the kind the Rust side matches on (`protocol::DeathKind`).
DEATH_REASONS = {
    "RAY_KILL": "killed",
    "WORKER_DIED": "worker_died",
    "NODE_DIED": "node_died",
    "OWNER_DIED": "owner_died",
}
# How long the GCS may take to record a death that a caller has already seen.
DEATH_CAUSE_WAIT_S = 2.0


def death_kind(handle):
    """The kind of the actor's death, read from the typed death cause the GCS recorded for it,
    never from message text: "other" when it records none, or a cause without a reason."""
    cause = _death_cause(handle)
    if cause is None:
        return "other"
    context = cause.WhichOneof("context")
    if context == "oom_context":
        return "out_of_memory"
    if context != "actor_died_error_context":
        return "other"
    died = cause.actor_died_error_context
    try:
        reason = type(died).Reason.Name(died.reason)
    except ValueError:  # a reason newer than this bridge
        return "other"
    return DEATH_REASONS.get(reason, "other")


def _death_cause(handle):
    """The `ActorDeathCause` of a dead actor from the GCS actor table (read directly: no
    dashboard), waiting up to DEATH_CAUSE_WAIT_S for the GCS to mark it dead."""
    actor_id = handle._actor_id.hex()
    deadline = time.monotonic() + DEATH_CAUSE_WAIT_S
    while True:
        try:
            info = ray._private.state.actors(actor_id=actor_id)
        except Exception as exc:
            print(f"trainyard-bridge: cannot read how actor {actor_id} died: {exc}", file=sys.stderr)
            return None
        if info.get("State") == "DEAD":
            return info.get("DeathCause")
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _number_map(resources):
    return {str(k): float(v) for k, v in resources.items()}


def _keep_resource(name):
    return not (name.startswith("node:") or "_group_" in name)


def op_nodes(req):
    available = ray._private.state.available_resources_per_node()
    out = []
    for node in ray.nodes():
        node_id = node["NodeID"]
        total = {k: float(v) for k, v in node.get("Resources", {}).items() if _keep_resource(k)}
        free = {
            k: float(v) for k, v in available.get(node_id, {}).items() if _keep_resource(k)
        }
        out.append(
            {
                "node_id": node_id,
                "ip": node.get("NodeManagerAddress", ""),
                "hostname": node.get("NodeManagerHostname", ""),
                "alive": bool(node.get("Alive", False)),
                "total": total,
                "available": free,
            }
        )
    return {"nodes": out}


def _held(table, key, kind, what):
    with STATE.lock:
        value = getattr(STATE, table).get(key)
    if value is None:
        raise OpError(kind, f"this bridge holds no {what} {key}")
    return value


def _group(pg_hex):
    return _held("groups", pg_hex, "unknown_group", "placement group")


def _bundle_nodes(table):
    nodes = table.get("bundles_to_node_id", {}) or {}
    count = len(table.get("bundles", {}) or {})
    return [nodes.get(i, "") or "" for i in range(count)]


def op_create_pg(req):
    options = {}
    avoid = req.get("avoid") or []
    if avoid:
        # Every node Ray labels with its id: none of these.
        selector = {"ray.io/node-id": "!in(" + ",".join(avoid) + ")"}
        options["bundle_label_selector"] = [dict(selector) for _ in req["bundles"]]
    pg = placement_group(
        req["bundles"], strategy=req["strategy"], name=req.get("name", ""), **options
    )
    pg_hex = pg.id.hex()
    with STATE.lock:
        STATE.groups[pg_hex] = pg
    return {"pg": pg_hex}


def op_pg_state(req):
    table = placement_group_table(_group(req["pg"]))
    return {
        "state": table.get("state", ""),
        "scheduling_state": (table.get("stats") or {}).get("scheduling_state", ""),
        "bundle_nodes": _bundle_nodes(table),
    }


def op_wait_pg(req):
    pg = _group(req["pg"])
    ready, _ = ray.wait([pg.ready()], timeout=bounded(req, "wait_pg", float(req["timeout_s"])))
    table = placement_group_table(pg)
    return {"ready": bool(ready), "bundle_nodes": _bundle_nodes(table)}


def op_remove_pg(req):
    pg = _group(req["pg"])
    remove_placement_group(pg)
    with STATE.lock:
        STATE.groups.pop(req["pg"], None)
        for record in STATE.actors.values():
            if record["pg"] == req["pg"] and record["state"] == "alive":
                record["state"] = "ending"
    return {}


def actor_options(req):
    given = req.get("options") or {}
    options = {
        "num_cpus": float(given.get("num_cpus", 0)),
        "num_gpus": float(given.get("num_gpus", 0)),
        "resources": {str(k): float(v) for k, v in (given.get("resources") or {}).items()},
        "name": req["name"],
        "max_concurrency": 4,
    }
    memory = int(given.get("memory") or 0)
    if memory:
        options["memory"] = memory
    object_store = int(given.get("object_store_memory") or 0)
    if object_store:
        options["object_store_memory"] = object_store
    if req.get("pg"):
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=_group(req["pg"]),
            placement_group_bundle_index=int(req.get("bundle", 0)),
        )
    return options


def op_spawn(req):
    """Creates the actor and starts its agent. The actor is killed again when anything fails,
    and when the start completes past the request's deadline: the driver has given up on it
    and would never end it."""
    name = req["name"]
    time_left(req, "spawn")
    handle = TrainyardActor.options(**actor_options(req)).remote()
    with STATE.lock:
        closing = STATE.closing
        if not closing:
            STATE.actors[name] = {"handle": handle, "state": "starting", "pg": req.get("pg")}
    if closing:
        _kill_quietly(handle)
        raise OpError("closing", f"the bridge is shutting down: actor {name} is not started")
    try:
        started = ray.get(
            handle.start.remote(
                req["program"],
                [str(a) for a in req.get("args", [])],
                {str(k): str(v) for k, v in (req.get("env") or {}).items()},
                req.get("config") or {},
                req.get("token", ""),
                req.get("cwd"),
            ),
            timeout=bounded(req, "spawn", float(req.get("timeout_s", 120))),
        )
        time_left(req, "spawn")
    except BaseException:
        _kill_quietly(handle)
        with STATE.lock:
            record = STATE.actors.get(name)
            if record is not None and record["handle"] is handle:
                del STATE.actors[name]
        raise
    with STATE.lock:
        STATE.actors[name]["state"] = "alive"
    threading.Thread(target=watch_actor, args=(name, handle), daemon=True).start()
    return started


def _kill_quietly(handle):
    try:
        ray.kill(handle)
    except Exception as exc:
        print(f"trainyard-bridge: cannot kill an actor: {_cause_text(exc)}", file=sys.stderr)


def watch_actor(name, handle):
    """Keeps one `wait` call in flight and reports how the agent or its actor ended."""
    ended = {"event": "actor_ended", "name": name, "exit_code": None, "signal": None, "died": None}
    unavailable_since = None
    ref = handle.wait.remote()
    while True:
        try:
            timeout = None
            if unavailable_since is not None:
                timeout = max(0.1, UNAVAILABLE_GRACE_S - (time.monotonic() - unavailable_since))
            code = ray.get(ref, timeout=timeout)
            if code is not None and code < 0:
                ended["signal"] = -code
            else:
                ended["exit_code"] = code
            ended["died"] = actor_death_after_agent_exit(handle, signaled=ended["signal"] is not None)
            break
        except ray.exceptions.ActorUnavailableError as exc:
            if unavailable_since is None:
                unavailable_since = time.monotonic()
            if time.monotonic() - unavailable_since >= UNAVAILABLE_GRACE_S:
                ended["died"] = failure("unavailable", exc)
                break
            time.sleep(0.5)
            ref = handle.wait.remote()
        except ray.exceptions.GetTimeoutError as exc:
            ended["died"] = failure("unavailable", f"unavailable for {UNAVAILABLE_GRACE_S} s: {exc}")
            break
        except ray.exceptions.ActorDiedError as exc:
            ended["died"] = failure(death_kind(handle), exc)
            break
        except Exception as exc:
            ended["died"] = failure("other", _cause_text(exc))
            break
    with STATE.lock:
        record = STATE.actors.get(name)
        if record is not None and record["handle"] is handle:
            record["state"] = "ended"
    emit(ended)


def actor_death_after_agent_exit(handle, signaled):
    """Whether the actor died too. When Ray destroys an actor (its group removed, its worker
    stopped) the agent may be signalled, and its exit seen, a moment before the actor's death;
    a signalled agent therefore gets a short pause, then one call on the actor tells."""
    if signaled:
        time.sleep(0.3)
    try:
        ray.get(handle.ping.remote(), timeout=5)
    except ray.exceptions.ActorDiedError as exc:
        return failure(death_kind(handle), exc)
    except Exception:
        return None  # unreachable or slow: report the agent's exit alone
    return None


def _actor(name):
    return _held("actors", name, "unknown_actor", "actor named")


def op_signal(req):
    record = _actor(req["name"])
    sent = ray.get(
        record["handle"].signal.remote(int(req["signal"]), req.get("task_pgid")),
        timeout=bounded(req, "signal", float(req.get("timeout_s", 10))),
    )
    return {"sent": bool(sent)}


def op_kill(req):
    record = _actor(req["name"])
    ray.kill(record["handle"])
    with STATE.lock:
        if record["state"] != "ended":
            record["state"] = "ending"
    return {}


def op_actors(req):
    with STATE.lock:
        actors = [{"name": n, "state": r["state"], "pg": r["pg"]} for n, r in STATE.actors.items()]
        groups = sorted(STATE.groups)
    return {"actors": actors, "groups": groups}


def op_cluster(req):
    """The GCS's own view of every actor and placement group (read directly: no dashboard)."""
    actors = [
        {
            "actor_id": actor_id,
            "name": info.get("Name", "") or "",
            "state": info.get("State", ""),
            "pid": info.get("Pid") or None,
            "job_id": info.get("JobID", ""),
        }
        for actor_id, info in ray._private.state.actors().items()
    ]
    groups = [
        {"pg": pg_hex, "name": info.get("name", "") or "", "state": info.get("state", "")}
        for pg_hex, info in placement_group_table().items()
    ]
    return {"actors": actors, "groups": groups}


def cleanup():
    with STATE.lock:
        STATE.closing = True
        handles = [r["handle"] for r in STATE.actors.values()]
        groups = list(STATE.groups.values())
        STATE.groups.clear()
    for handle in handles:
        try:
            ray.kill(handle)
        except Exception:
            pass
    for pg in groups:
        try:
            remove_placement_group(pg)
        except Exception:
            pass


def op_shutdown(req):
    cleanup()
    return {}


def op_ping(req):
    return {}


OPS = {
    "nodes": op_nodes,
    "create_pg": op_create_pg,
    "pg_state": op_pg_state,
    "wait_pg": op_wait_pg,
    "remove_pg": op_remove_pg,
    "spawn": op_spawn,
    "signal": op_signal,
    "kill": op_kill,
    "actors": op_actors,
    "cluster": op_cluster,
    "shutdown": op_shutdown,
    "ping": op_ping,
}
# Quick calls that end or inspect what runs: their own threads, never queued behind spawns.
CONTROL_OPS = frozenset(("kill", "signal", "remove_pg", "actors", "ping", "shutdown"))


_LINE_ID = re.compile(r'"id"\s*:\s*(\d+)')


def parse_request(line):
    """The request on `line` and None, or None and the error reply the line gets: with the
    line's id when one can be read, else a null id."""
    try:
        req = json.loads(line)
    except ValueError as exc:
        found = _LINE_ID.search(line)
        rid = int(found.group(1)) if found else None
        return None, {"id": rid, "error": failure("protocol", f"the request line is not JSON: {exc}")}
    if not isinstance(req, dict):
        kind = type(req).__name__
        return None, {
            "id": None,
            "error": failure("protocol", f"the request line is a JSON {kind}, not an object"),
        }
    rid = req.get("id")
    if isinstance(rid, bool) or not isinstance(rid, int) or rid < 0:
        return None, {
            "id": None,
            "error": failure("protocol", f"the request's id is {rid!r}; a non-negative integer is expected"),
        }
    return req, None


def handle(req):
    rid = req.get("id")
    op = OPS.get(req.get("op"))
    try:
        if op is None:
            raise OpError("protocol", f"unknown op {req.get('op')!r}")
        time_left(req, req["op"])
        emit({"id": rid, "ok": op(req)})
    except BaseException as exc:
        emit({"id": rid, "error": failure(classify(exc), _cause_text(exc))})
    if req.get("op") == "shutdown":
        finish(0)


def finish(code):
    try:
        ray.shutdown()
    finally:
        with _proto_lock:
            proto.flush()
        os._exit(code)


def start_kind(exc):
    text = _cause_text(exc)
    if isinstance(exc, getattr(ray.exceptions, "AuthenticationError", ())) or any(
        marker in text for marker in ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")
    ):
        return "auth"
    if isinstance(exc, ConnectionError) or "Failed to connect" in text:
        return "unreachable"
    return "start"


def start_message(kind, exc):
    """The failure's text; for auth, the top error and the line that names the auth problem
    (the full chain holds a multi-line traceback from the GCS client)."""
    text = _cause_text(exc)
    if kind != "auth":
        return text
    lines = [l.strip() for l in text.splitlines() if "Authentication" in l or "InvalidAuthToken" in l]
    top = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"{top} ({lines[-1]})" if lines and lines[-1] not in top else top


def main():
    started = time.monotonic()
    try:
        ray.init(address=ADDRESS, namespace=NAMESPACE, log_to_driver=False)
    except BaseException as exc:
        kind = start_kind(exc)
        emit({"event": "failed", "kind": kind, "message": start_message(kind, exc)})
        os._exit(3)
    ctx = ray.get_runtime_context()
    emit(
        {
            "event": "ready",
            "ray_version": ray.__version__,
            "node_ip": ray.util.get_node_ip_address(),
            "address": ctx.gcs_address,
            "started_head": ADDRESS is None,
            "init_s": time.monotonic() - started,
        }
    )
    from concurrent.futures import ThreadPoolExecutor

    work = ThreadPoolExecutor(max_workers=32, thread_name_prefix="trainyard-op")
    control = ThreadPoolExecutor(max_workers=8, thread_name_prefix="trainyard-control")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req, rejected = parse_request(line)
        if rejected is not None:
            emit(rejected)
            continue
        (control if req.get("op") in CONTROL_OPS else work).submit(handle, req)
    # EOF: the driver closed our stdin (or exited): leave nothing behind.
    cleanup()
    finish(0)


if __name__ == "__main__":
    main()
