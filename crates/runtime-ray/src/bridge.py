"""trainyard's bridge to Ray: line-delimited JSON on stdin/stdout, nothing decided here.

Requests on stdin:   {"id": N, "op": "...", ...args}
Replies on stdout:   {"id": N, "ok": {...}} | {"id": N, "error": {"kind": "...", "message": "..."}}
Events on stdout:    {"event": "ready" | "failed" | "actor_ended", ...}

Ray prints to fd 1 (raylet error lines, autoscaler messages), so the protocol gets a private
duplicate of fd 1 and fd 1 itself becomes stderr before ray is imported. Placement, sizing and
every other decision belong to the Rust driver; this file only translates.
"""

import ctypes
import json
import os
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
    emit({"event": "failed", "kind": "start", "message": f"cannot import ray: {_cause_text(exc)}"})
    sys.exit(2)

ADDRESS = os.environ.get("TRAINYARD_RAY_ADDRESS") or None
NAMESPACE = os.environ.get("TRAINYARD_RAY_NAMESPACE") or "trainyard"
# How long an actor whose node stopped answering may stay "unavailable" before it is reported
# as ended: Ray marks a lost node dead after about 15 s (3 s health checks x 5), after which the
# wait call raises ActorDiedError (reported as node_died, measured at 15 s); past this bound it
# is reported with kind "unavailable". Set by the Rust side (BridgeConfig::unavailable_grace).
UNAVAILABLE_GRACE_S = float(os.environ.get("TRAINYARD_RAY_UNAVAILABLE_GRACE_S", "30"))
ACCELERATOR_KEYS = ("GPU", "neuron_cores", "TPU", "NPU", "HPU")


@ray.remote
class TrainyardActor:
    """Hosts one trainyard agent process, in this actor's own process group."""

    def __init__(self):
        self.proc = None

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
        if signum == signal.SIGKILL and task_pgid:
            try:
                os.killpg(task_pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
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
    pg = placement_group(req["bundles"], strategy=req["strategy"], name=req.get("name", ""))
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
    ready, _ = ray.wait([pg.ready()], timeout=float(req["timeout_s"]))
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
    name = req["name"]
    handle = TrainyardActor.options(**actor_options(req)).remote()
    with STATE.lock:
        STATE.actors[name] = {"handle": handle, "state": "starting", "pg": req.get("pg")}
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
            timeout=float(req.get("timeout_s", 120)),
        )
    except BaseException:
        try:
            ray.kill(handle)
        except Exception:
            pass
        with STATE.lock:
            STATE.actors.pop(name, None)
        raise
    with STATE.lock:
        STATE.actors[name]["state"] = "alive"
    threading.Thread(target=watch_actor, args=(name, handle), daemon=True).start()
    return started


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
        timeout=float(req.get("timeout_s", 10)),
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
}


def handle(req):
    rid = req.get("id")
    op = OPS.get(req.get("op"))
    try:
        if op is None:
            raise OpError("protocol", f"unknown op {req.get('op')!r}")
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

    pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="trainyard-op")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as exc:
            emit({"event": "protocol_error", "message": f"bad request line: {exc}"})
            continue
        pool.submit(handle, req)
    # EOF: the driver closed our stdin (or exited): leave nothing behind.
    cleanup()
    finish(0)


if __name__ == "__main__":
    main()
