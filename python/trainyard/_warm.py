"""A warm Python (``trainyard run --warm-python MODULES``): it imports MODULES once, then starts
each Python task of the run's workers as a fork of itself, so that a restarted rank does not
pay for starting Python and importing them again. Where torch is among them, it also imports
what torch defers to a training program's first optimizer (``torch._dynamo``).

Started by the local runtime, or by an agent on Ray and Slurm, as ``python WARM_PY SOCKET MODULE...`` (this file, copied beside
SOCKET) with its secret as the first line of its stdin; it listens on the Unix socket SOCKET
(made under a umask of 077, in a folder of mode 0700 that the runtime made: only its user can enter it, whatever
the umask; an agent also checks that the process listening is this one, by its credentials,
before it sends anything) once it has imported MODULES, so that an agent that
finds no socket knows the imports are not done (and starts its task cold once it has waited
long enough), and ends when its stdin closes (whoever started it is gone), killing the tasks it
started. Should a module fail to import, every task is refused with the reason.

One connection per task, from the task's agent:

- agent → here: a 4-byte big-endian length, then that many bytes of JSON ``{"token", "argv",
  "env", "cwd", "cgroup", "cgroup_required", "address_space"}``; the first bytes carry the
  task's stdin, stdout and stderr (``SCM_RIGHTS``).
- here → agent: JSON lines: ``{"started": PID, "joined": BOOL}`` once the task is set up (a
  session of its own, the worker's cgroup, its limits, its descriptors and environment), or
  ``{"error": TEXT}``; then ``{"status": WAIT_STATUS}`` when it has ended, after the rest of
  its process group was killed. A connection that closes before that kills the task's group.

A task may park instead of ending (``park``: a ``TorchTrainer`` loop function that failed or
was stopped, see ``trainyard._worker``): it says so on a socket of its own to this process,
which tells its agent ``{"status": WAIT_STATUS, "parked": true}`` (the status it gives) without
killing its group, and keeps the process. The next request for the same worker (its cgroup)
and command line goes to that process, with the new connection and descriptors; it says
``resumed`` on its socket once set up (until then the request is kept here, and started as a
new fork should the process end instead), answers ``{"started": PID, ...}`` as a forked task
would, then runs the command again in its own interpreter: only what it left behind in its
modules differs from a fork. A parked
process not asked again within ``PARKED_FOR`` seconds, or whose socket this process closes as
it ends, runs its exit handlers and exits as it would have; this process gives it
``PARKED_END`` seconds for that before it kills its group.

The task runs ``argv`` as ``python`` would: ``SCRIPT ARGS``, ``-m MODULE ARGS`` or ``-c CODE
ARGS`` (after ``-u`` or ``-B``). Any other interpreter option is executed cold, as given.
Where torch is imported, a forked rank other than 0 joins an ``env://`` process group once
rank 0's store listens, rather than after torch's back-off.
"""

import errno
import hmac
import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback

HEADER = struct.Struct(">I")
MAX_REQUEST = 16 * 1024 * 1024
# Where a forked task finds its socket to this process, and whether it joined its worker's
# cgroup: ``FD:JOINED``.
PARK_ENV = "TRAINYARD_WARM_PARK"
# How long a parked task waits for its next request, and how long this process, ending,
# waits for its parked tasks to run their exit handlers (its own end is given 0.5 s).
PARKED_FOR = 600
PARKED_END = 0.3
# What a parked task says (with the wait status its agent is told it ended with: SIGTERM's
# unless it says another).
PARKED = b"parked"
# What a parked task says once it took the request handed to it.
RESUMED = b"resumed"
PARKED_STATUS = signal.SIGTERM


def _fail(text):
    sys.stderr.write(f"trainyard: --warm-python: {text}\n")
    sys.stderr.flush()
    os._exit(2)


class Task:
    """A task started here: its process (the leader of its group), its agent's connection,
    and whether its end was told (its leader is kept a zombie until the agent closes the
    connection, so that its pid, and its group's, name nobody else meanwhile)."""

    def __init__(self, pid, conn, key, park):
        self.pid = pid
        self.conn = conn
        self.told = False
        self.abandoned = False
        # Which worker and command line it runs (the next request it may take if parked),
        # its socket (this end), and whether it is parked.
        self.key = key
        self.park = park
        self.parked = False
        # A request handed to it while parked, until it says it took it: (request, its
        # descriptors, its agent's connection).
        self.resuming = None

    def again(self, conn):
        """The parked task, having taken the request that came on `conn`."""
        self.resuming = None
        self.conn = conn
        self.told = False
        self.abandoned = False
        self.parked = False


def _recv_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the agent closed the connection mid-request")
        data += chunk
    return data


def _read_request(conn, token):
    """The request on `conn` and the descriptors that came with it; `None` for a stranger
    or a request cut short (its descriptors closed)."""
    conn.settimeout(30)
    fds = []
    try:
        head, fds, _flags, _addr = socket.recv_fds(conn, HEADER.size, 3)
        if len(head) < HEADER.size:
            head += _recv_exactly(conn, HEADER.size - len(head))
        (length,) = HEADER.unpack(head)
        if length > MAX_REQUEST or len(fds) != 3:
            raise ValueError("not a request")
        request = json.loads(_recv_exactly(conn, length))
        if not isinstance(request, dict) or not hmac.compare_digest(
            str(request.get("token", "")).encode(), token.encode()
        ):
            raise ValueError("not a request")
        return request, fds
    except Exception:  # noqa: BLE001 - whatever a stranger sent, nothing of it stays
        for fd in fds:
            os.close(fd)
        return None


def _send(conn, message):
    if conn is None:
        return
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def serve(token, listener, base_path, refusal):
    """Starts tasks until stdin closes; returns only in a started task, with what it runs."""
    woken_r, woken_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(woken_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "driver")
    tasks = {}  # pid -> Task
    parked = {}  # Task.key -> a parked Task whose agent is done with it
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "driver":
                    if not os.read(sys.stdin.fileno(), 4096):
                        # The driver is gone: its directory for this goes too.
                        import shutil

                        shutil.rmtree(os.path.dirname(listener.getsockname()), ignore_errors=True)
                        return None
                elif key.data == "child":
                    try:
                        while os.read(woken_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    _reap(tasks, selector, parked)
                elif key.data == "accept":
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    started = _start(
                        conn, token, tasks, selector, listener, base_path, refusal, parked
                    )
                    if started is not None:
                        # The forked task: none of this loop's state is its own.
                        selector.close()
                        os.close(woken_r)
                        os.close(woken_w)
                        return started
                elif isinstance(key.data, tuple):
                    if key.fileobj is not key.data[1].park:
                        continue  # closed earlier in this round
                    started = _heard_from_task(
                        tasks,
                        key.data[1],
                        selector,
                        parked,
                        lambda request, fds, conn: _fork(
                            request, fds, conn, tasks, selector, listener, base_path
                        ),
                    )
                    if started is not None:
                        selector.close()
                        os.close(woken_r)
                        os.close(woken_w)
                        return started
                else:
                    # The agent's connection closed: once the task's end was told, the
                    # agent is done with it (reap it); before, the agent is gone (kill it).
                    task = key.data
                    if key.fileobj is not task.conn:
                        continue  # let go of earlier in this round
                    try:
                        data = task.conn.recv(1)
                    except OSError:
                        data = b""
                    if not data:
                        # A parked task's agent is done with it; it waits for the next.
                        _let_go(task, selector)
                        if task.parked:
                            if _has_exited(task.pid):
                                _end_parked(task, selector, parked)
                                _reap_leader(tasks, task, selector)
                            continue
                        if task.told:
                            _reap_leader(tasks, task, selector)
                        else:
                            task.abandoned = True
                            _kill_group(task.pid)
    finally:
        # Here only in this process (a task returned above before this runs for it).
        if os.getpid() == MAIN_PID:
            _let_parked_end(parked.values())
            for task in tasks.values():
                _kill_group(task.pid)


def _let_parked_end(waiting):
    """Tells each parked task it gets no more requests (it runs its exit handlers and exits)
    and waits for them a moment at most (``PARKED_END``), within what the runtime or agent
    gives this process to end."""
    import time

    waiting = list(waiting)
    for task in waiting:
        if task.park is not None:
            task.park.close()
            task.park = None
    deadline = time.monotonic() + PARKED_END
    while waiting and time.monotonic() < deadline:
        waiting = [task for task in waiting if not _has_exited(task.pid)]
        time.sleep(0.005)


def _has_exited(pid):
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _heard_from_task(tasks, task, selector, parked, fork):
    """What a task said on its socket: that it parked (its agent is told it ended, its group
    is left as it is), that it took the request handed to it, or nothing more (it ended, ran
    a program of its own, or, parked, is ending: a request handed to it is started anew with
    `fork`, and it is reaped once it has exited). Returns what `fork` returned."""
    try:
        said = task.park.recv(64)
    except OSError:
        said = b""
    word, _, status = said.partition(b" ")
    if word == RESUMED and task.resuming is not None:
        _request, fds, conn = task.resuming
        for fd in fds:
            os.close(fd)
        task.again(conn)
        selector.register(conn, selectors.EVENT_READ, task)
        return None
    if word == PARKED and not task.told:
        if task.abandoned or task.conn is None:
            # Its agent is gone and it was killed: nobody is left to tell, nor to ask again.
            return None
        task.parked = True
        task.told = True
        _send(task.conn, {"status": int(status or PARKED_STATUS), "parked": True})
        _keep_parked(tasks, task, selector, parked)
        return None
    if said:
        return None
    _close_park(task, selector)
    if parked.get(task.key) is task:
        del parked[task.key]
    resuming, task.resuming = task.resuming, None
    if task.parked and task.conn is None and _has_exited(task.pid):
        _reap_leader(tasks, task, selector)
    if resuming is not None:
        return fork(*resuming)
    return None


def _keep_parked(tasks, task, selector, parked):
    """Parked `task` waits for its worker's next request (one parked task per worker and
    command line: an older one ends)."""
    older = parked.get(task.key)
    if older is not None:
        _end_parked(older, selector, parked)
    parked[task.key] = task


def _end_parked(task, selector, parked):
    """Ends parked `task`: its group killed (it is reaped once it has exited: ``_reap``)."""
    if parked.get(task.key) is task:
        del parked[task.key]
    _let_go(task, selector)
    _close_park(task, selector)
    _kill_group(task.pid)


def _close_park(task, selector):
    """Closes this end of `task`'s socket."""
    task.park = _drop(task.park, selector)


def _let_go(task, selector):
    """Closes the connection of `task`'s agent, which was told its end."""
    task.conn = _drop(task.conn, selector)


def _drop(sock, selector):
    """Closes `sock` (if any), no longer watched by `selector`; `None`."""
    if sock is not None:
        try:
            selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
    return None


def _resume(task, request, fds, conn):
    """Hands the request that came on `conn` to parked `task`; whether it took it."""
    body = json.dumps(request).encode()
    try:
        socket.send_fds(task.park, [body], list(fds) + [conn.fileno()])
    except OSError:
        return False
    return True




def _reap(tasks, selector, parked):
    """Tells the end of every task that ended: its group killed first (its leader is a
    zombie still, so the group is the task's), then its wait status. A task whose agent is
    gone is reaped at once, as is a parked task that ended once its agent is done with it."""
    for task in list(tasks.values()):
        if task.told:
            if (
                task.parked
                and task.conn is None
                and task.resuming is None
                and _has_exited(task.pid)
            ):
                _end_parked(task, selector, parked)
                _reap_leader(tasks, task, selector)
            continue
        try:
            exited = os.waitid(os.P_PID, task.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            exited = None
            task.told = True
            _send(task.conn, {"status": 255 << 8})
        if exited is None:
            continue
        _kill_group(task.pid)
        task.told = True
        if task.abandoned:
            _reap_leader(tasks, task, selector)
            continue
        _send(task.conn, {"status": _wait_status(exited)})


def _wait_status(exited):
    """The wait status ``waitpid`` would give for what ``waitid`` saw."""
    if exited.si_code == os.CLD_EXITED:
        return (exited.si_status & 0xFF) << 8
    if exited.si_code == os.CLD_DUMPED:
        return exited.si_status | 0x80
    return exited.si_status


def _reap_leader(tasks, task, selector):
    try:
        os.waitpid(task.pid, 0)
    except ChildProcessError:
        pass
    # Never to be read again: a later fork must not inherit it.
    _close_park(task, selector)
    tasks.pop(task.pid, None)


def _start(conn, token, tasks, selector, listener, base_path, refusal, parked):
    got = _read_request(conn, token)
    if got is None:
        conn.close()
        return None
    request, fds = got
    if refusal is not None:
        for fd in fds:
            os.close(fd)
        _send(conn, {"error": refusal})
        conn.close()
        return None
    conn.settimeout(None)
    key = (request.get("cgroup"), tuple(request.get("argv") or ()))
    waiting = parked.pop(key, None)
    if waiting is not None:
        if _resume(waiting, request, fds, conn):
            # Its own once it says it took it (else forked anew: ``_heard_from_task``).
            _let_go(waiting, selector)
            waiting.resuming = (request, fds, conn)
            return None
        _end_parked(waiting, selector, parked)
    return _fork(request, fds, conn, tasks, selector, listener, base_path)


def _fork(request, fds, conn, tasks, selector, listener, base_path):
    """Starts the task `request` asks for as a fork of this process: returns, in the fork
    only, what it runs."""
    key = (request.get("cgroup"), tuple(request.get("argv") or ()))
    sys.stdout.flush()
    sys.stderr.flush()
    park, its_park = _park_pair(request)
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            if park is not None:
                park.close()
            for task in tasks.values():
                for held in (task.conn, task.park, *(task.resuming or ())[2:]):
                    if held is not None:
                        held.close()
                for fd in (task.resuming or (None, ()))[1]:
                    os.close(fd)
            return _become_task(request, fds, conn, base_path, its_park)
        except BaseException as error:  # noqa: BLE001 - told to the agent, then gone
            _send(conn, {"error": f"{type(error).__name__}: {error}"})
            os._exit(127)
    for fd in fds:
        os.close(fd)
    tasks[pid] = Task(pid, conn, key, park)
    selector.register(conn, selectors.EVENT_READ, tasks[pid])
    if park is not None:
        its_park.close()
        selector.register(park, selectors.EVENT_READ, ("park", tasks[pid]))
    return None


# The one program that parks: a ``TorchTrainer`` loop function's worker.
PARKS = "trainyard._worker"


def _park_pair(request):
    """The sockets a task that may park and this process talk on (this end, the task's), or
    ``(None, None)`` for a task that does not park."""
    run = _what_to_run((request.get("argv") or [])[1:])
    if run is None or run[1:3] != ("module", PARKS):
        return None, None
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _become_task(request, fds, conn, base_path, park):
    """In the forked child: the task's set-up, then what it runs."""
    global PARK_SOCKET
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for signum in SCHEDULER_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    os.setsid()
    _die_with_parent()
    joined = False
    cgroup = request.get("cgroup")
    if cgroup:
        try:
            fd = os.open(cgroup, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
            joined = True
        except OSError as error:
            if request.get("cgroup_required"):
                raise OSError(
                    error.errno, f"cannot join the worker's cgroup {cgroup}: {error.strerror}"
                )
    limit = request.get("address_space")
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.chdir(request["cwd"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    argv = request["argv"]
    run = _what_to_run(argv[1:])
    if run is None:
        # An interpreter option this does not emulate: the task starts cold, as given.
        _send(conn, {"started": os.getpid(), "joined": joined})
        conn.close()
        os.execve(argv[0], argv, env)
    if park is not None:
        PARK_SOCKET = park
        os.environ[PARK_ENV] = f"{park.fileno()}:{int(joined)}"
    unbuffered, kind, target, args = run
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    _streams(unbuffered)
    _threads(env)
    if env.get("PYTHONDONTWRITEBYTECODE") or "-B" in argv[1:]:
        sys.dont_write_bytecode = True
    _set_path(kind, target, env, base_path)
    _reseed()
    _send(conn, {"started": os.getpid(), "joined": joined})
    conn.close()
    return kind, target, args


def park_socket():
    """In a task forked here: its socket to the warm Python and whether it joined its worker's
    cgroup, taken out of its environment; `None` in any other process."""
    fd, _, joined = os.environ.pop(PARK_ENV, "").partition(":")
    if not fd.isdigit():
        return None
    try:
        return socket.socket(fileno=int(fd)), joined == "1"
    except OSError:
        return None


def park(sock, joined, status=PARKED_STATUS, patience=PARKED_FOR):
    """Parks this task (forked here, its work stopped and undone by the caller): the warm
    Python tells its agent it ended, and hands it the worker's next request for the same
    command line. Returns once set up for that request as a forked task would be (its
    descriptors, working directory, environment and streams; its agent told it started);
    ends the process when no request comes within `patience` seconds, or the warm Python
    is gone. Its agent is told it ended with wait status `status`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # Its agent reads its output until the last holder closes it.
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    try:
        body, fds = _wait_parked(sock, PARKED + b" %d" % status, patience)
    except OSError:
        body, fds = b"", []
    if not body or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        _end_parked_process(sock, status)
    conn = socket.socket(fileno=fds[3])
    try:
        request = json.loads(body)
        os.chdir(request["cwd"])
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        run = _what_to_run(request["argv"][1:])
        _streams(bool(run and run[0]) or bool(env.get("PYTHONUNBUFFERED")))
        _threads(env)
        _reseed()
        sock.send(RESUMED)
    except BaseException:  # noqa: BLE001 - the warm Python starts the request anew
        os._exit(127)
    _send(conn, {"started": os.getpid(), "joined": joined})
    conn.close()


def _wait_parked(sock, parked, patience):
    """Says `parked` on `sock`, then waits for the next request on it: the request and its
    descriptors; ``(b"", [])`` when the warm Python closed it, `patience` seconds passed, or
    SIGTERM came (its agent, exiting, ends it). A SIGTERM is seen whenever it comes once the
    warm Python can know of the park: through a wake-up pipe, not only between the
    interpreter's steps."""
    import select
    import time

    woken_r, woken_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGTERM, lambda *_: None)
    previous = signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
    try:
        sock.send(parked)
        deadline = time.monotonic() + patience
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"", []
            ready, _, _ = select.select([sock, woken_r], [], [], left)
            if woken_r in ready:
                try:
                    if signal.SIGTERM in os.read(woken_r, 64):
                        return b"", []
                except BlockingIOError:
                    pass
            if sock in ready:
                body, fds, _flags, _addr = socket.recv_fds(sock, PARK_MESSAGE, 4)
                return body, fds
    finally:
        signal.set_wakeup_fd(previous)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(woken_r)
        os.close(woken_w)


def _end_parked_process(sock, status):
    """Ends this parked process as it would have ended had it not parked: it takes no
    request any more (its socket shut, so that the warm Python starts the next one anew),
    its exit handlers run (a tracker's ``finish``, a logger's flush), then it exits as its
    wait status `status` says (a signal's as 128 + its number)."""
    import atexit

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - nothing is left to tell it to
        pass
    os._exit(status >> 8 if status & 0x7F == 0 else 128 + (status & 0x7F))


# The largest request a parked task takes (the request is one message on its socket).
PARK_MESSAGE = 4 * 1024 * 1024


def _streams(unbuffered):
    """stdout and stderr as a fresh interpreter would have them on these pipes: stdout
    block-buffered, stderr line-buffered; neither buffered at all with ``-u``."""
    import io

    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "wb", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        setattr(
            sys,
            name,
            io.TextIOWrapper(
                binary,
                encoding=old.encoding,
                errors=old.errors,
                line_buffering=name == "stderr" and not unbuffered,
                write_through=unbuffered,
            ),
        )
        setattr(sys, f"__{name}__", getattr(sys, name))


def _threads(env):
    """The task's ``OMP_NUM_THREADS``: torch read the warm Python's as it was imported."""
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _die_with_parent():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != MAIN_PID:
        os._exit(127)


def _what_to_run(args):
    """``(unbuffered, kind, target, argv)`` for the command line after the interpreter, or
    `None` where it holds an option this does not emulate."""
    unbuffered = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-u",):
            unbuffered = True
        elif arg == "-B":
            pass
        elif arg in ("-m", "-c"):
            if i + 1 >= len(args):
                return None
            kind = "module" if arg == "-m" else "code"
            rest = args[i + 2 :]
            return unbuffered, kind, args[i + 1], (["-m"] if kind == "module" else ["-c"]) + rest
        elif arg == "--":
            if i + 1 >= len(args):
                return None
            return unbuffered, "script", args[i + 1], args[i + 1 :]
        elif arg.startswith("-"):
            return None
        else:
            return unbuffered, "script", arg, args[i:]
        i += 1
    return None


def _set_path(kind, target, env, base_path):
    """``sys.path`` as a fresh interpreter would have it for this task."""
    if kind == "script":
        first = os.path.dirname(os.path.realpath(target))
    elif kind == "module":
        first = os.getcwd()
    else:
        first = ""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first] + extra + base_path


def _reseed():
    """Random state a fresh process would not share with its siblings."""
    numpy = sys.modules.get("numpy.random")
    if numpy is not None:
        try:
            numpy.seed()
        except Exception:  # noqa: BLE001 - a numpy without the legacy global state
            pass


def _run(kind, target, argv):
    import runpy

    sys.argv = argv
    if kind == "script":
        sys.argv[0] = target
        runpy.run_path(target, run_name="__main__")
    elif kind == "module":
        runpy._run_module_as_main(target, alter_argv=True)
    else:
        import types

        main = types.ModuleType("__main__")
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)


def wait_for_store(host, port, timeout_s, error=RuntimeError):
    """Returns once rank 0's store listens at ``host:port``, for a rank other than 0 to join
    the process group then. torch's store client that finds nothing listening yet retries
    after a back-off of hundreds of milliseconds, and ranks started together (a restart's,
    above all) often lose that race: 4 restarts of 8 took 0.5-0.9 s instead of 0.15 s here.
    A refused connection costs microseconds, so this polls every millisecond for the first
    0.1 s, then less often (up to every 20 ms), as rank 0 is then busy with something else.
    Raises ``error`` when nothing listens within ``timeout_s``, as joining would have failed
    then."""
    import time

    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        failure = None
        try:
            with socket.create_connection((host, port), timeout=min(1.0, timeout_s)) as probe:
                # A probe within this host's own port range can meet itself: no listener.
                if probe.getsockname() != probe.getpeername():
                    return
        except OSError as refused:
            failure = refused
        if time.monotonic() >= deadline:
            raise error(
                f"rank 0's store at {host}:{port} did not listen within {timeout_s} s: "
                f"{failure or 'the probe met itself'}"
            ) from failure
        waited = time.monotonic() - started
        time.sleep(0.001 if waited < 0.1 else min(0.02, waited / 10))


def join_once_the_store_listens():
    """Has torch's ``env://`` rendezvous, in a rank other than 0, first wait for rank 0's
    store to listen (``wait_for_store``), so that ranks started together do not wait out
    torch's back-off; once per process. The rank is torch's (the URL's, else ``$RANK``);
    ``TORCHELASTIC_USE_AGENT_STORE`` (the store is up before the ranks) and rank 0 go
    straight to torch's handler. Nothing is done where torch's rendezvous module is not
    imported or keeps its handlers otherwise. Called by the warm Python for the ranks it
    forks, and by ``trainyard._worker`` before it joins."""
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    handlers = getattr(rendezvous, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or not callable(handlers.get("env")):
        return
    original = handlers["env"]
    if getattr(original, "trainyard_waits_for_the_store", False):
        return

    def env_once_the_store_listens(url, *args, **kwargs):
        from urllib.parse import parse_qs, urlparse

        rank = (parse_qs(urlparse(url).query).get("rank") or [os.environ.get("RANK", "0")])[0]
        try:
            waits = int(rank) != 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        except ValueError:
            waits = False
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
        if waits and addr and port.isdigit():
            timeout = kwargs.get("timeout", args[0] if args else None)
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else 1800
            torch_distributed = sys.modules.get("torch.distributed")
            error = getattr(torch_distributed, "DistNetworkError", RuntimeError)
            wait_for_store(addr, int(port), seconds, error)
        yield from original(url, *args, **kwargs)

    env_once_the_store_listens.trainyard_waits_for_the_store = True
    handlers["env"] = env_once_the_store_listens


def _user_frames(tb):
    """`tb` without the frames of this module and of runpy, which start every task."""
    import runpy

    ours = {_user_frames.__code__.co_filename, "<frozen runpy>", runpy.__file__}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


# What torch imports only when first asked for it, and every training program asks for: the
# first optimizer (`torch.optim.SGD(...)`) imports `torch._dynamo`, about a second here.
TORCH_DEFERS = ("torch._dynamo",)


def import_what_torch_defers():
    """Where torch was imported, imports what it defers to a training program's first steps
    (`TORCH_DEFERS`), so that a forked rank does not pay for it on every restart. Best
    effort: a torch without it is still served."""
    if "torch" not in sys.modules:
        return
    for module in TORCH_DEFERS:
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - the rank imports it itself, as a cold one would
            pass


# What a scheduler sends every process of a job step (Slurm's SIGTERM as it cancels the job
# or its time runs out, a `--signal` warning): the warm Python's life is its stdin's, so it
# ignores them, lest its forked ranks die with it (their parent-death signal) before their
# own handlers run; each rank, told by the scheduler and by its agent, takes them as a cold
# one would.
SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def main():
    global MAIN_PID
    MAIN_PID = os.getpid()
    for signum in SCHEDULER_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if len(sys.argv) < 2:
        _fail("no socket to listen on")
    path, modules = sys.argv[1], sys.argv[2:]
    token = sys.stdin.readline().strip()
    if not token:
        _fail("no token on stdin")
    # This file's own directory: nothing to import from there.
    del sys.path[0]
    zygote_extra = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    refusal = None
    for module in modules:
        try:
            __import__(module)
        except BaseException as error:  # noqa: BLE001 - every task is refused with it
            refusal = (
                f"--warm-python: `{module}` cannot be imported by {sys.executable}: "
                f"{type(error).__name__}: {error}"
            )
            break
    if refusal is None:
        import_what_torch_defers()
    base_path = [p for p in sys.path if p not in zygote_extra]
    join_once_the_store_listens()
    import gc

    gc.freeze()
    # The socket appears listening: an agent that finds it and is refused knows this ended.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The socket file is this user's alone whatever the umask (its folder is too): no one
    # else may connect to it. The umask is restored before any task is forked.
    umask = os.umask(0o077)
    try:
        listener.bind(path + ".binding")
    finally:
        os.umask(umask)
    listener.listen(128)
    os.rename(path + ".binding", path)
    started = serve(token, listener, base_path, refusal)
    if started is None:
        return
    kind, target, argv = started
    import atexit

    interrupted = []

    def end_as_interrupted():
        # Last of the exit handlers: a cold interpreter ends by SIGINT after its teardown.
        if interrupted:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    atexit.register(end_as_interrupted)
    try:
        _run(kind, target, argv)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - printed as Python prints it, exit 1
        # Python prints the exception's own traceback: trimmed first.
        error.__traceback__ = _user_frames(error.__traceback__)
        sys.excepthook(type(error), error, error.__traceback__)
        if isinstance(error, KeyboardInterrupt):
            interrupted.append(True)
        raise SystemExit(1) from None


MAIN_PID = 0
# A forked task's socket to this process (kept open for it to park on).
PARK_SOCKET = None

if __name__ == "__main__":
    main()
