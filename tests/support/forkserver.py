"""A fork server for the real-process tests: ``python manage.py …`` children that skip
the interpreter's and Django's start-up, still real OS processes.

Each child of a test costs well over half a second of CPU before it runs its first
line of the command: the interpreter, Django, the libraries, the settings, the apps.
The tests start several hundred such children, so that start-up dominates them. This
module lets a test process start them from a server that has paid part of it once:

- the *server* (one per test process, started at its first spawn) has imported Django
  and the libraries every child imports, and nothing of the project, with no settings
  configured (``DJANGO_SETTINGS_MODULE`` unset, so any import that reads a setting
  fails there rather than reading the wrong one);
- for each environment it is asked to run in (the child's variables, minus those
  nothing reads while Django is set up: ``_UNKEYED``) it forks a *zygote*: that
  process takes the environment, calls ``django.setup()`` (the settings module reads
  the environment, the apps load and install their fault hooks), imports the URL
  configuration and the project's management commands, and then waits. A zygote is
  kept only if that left no thread, no open file or socket and no database connection
  behind and printed nothing; otherwise (a bad settings module, a hook that opens a
  log file) the server runs children of that environment itself, and each child sets
  Django up on its own;
- each spawn forks a *child* from the zygote (or the server): it gets the test's
  stdin, stdout and stderr as its file descriptors 0, 1 and 2 and no other, the
  spawn's environment, working directory, ``sys.argv`` and ``sys.path`` (the script's
  folder, then ``PYTHONPATH``), stdio objects made as the interpreter makes them
  (``PYTHONUNBUFFERED``), and runs the script as ``__main__`` with ``runpy``; the
  interpreter then ends the way it ends after any script (``SystemExit``'s status, a
  traceback and status 1, non-daemon threads joined, ``atexit`` handlers run).

The child's pid is its own: SIGTERM, SIGKILL and SIGINT reach it and only it, and its
parent (the zygote) reaps it and sends the test its exit status as ``Popen`` would
give it (minus the signal's number when a signal ended it). :class:`ForkedProcess`
has ``Popen``'s ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
``terminate`` and ``kill``; signals go through a pidfd, so a reused pid is never hit.

What stays a plain ``subprocess.Popen`` (see :func:`spawn`): a spawn that asks for it
(``real=True``: the tests of start-up itself), anything but ``python SCRIPT``, an
environment that changes what the interpreter reads when it starts (``PYTHON*``
other than ``PYTHONPATH``, ``PYTHONUNBUFFERED``, ``PYTHONDONTWRITEBYTECODE``;
locale, ``TZ``, ``OTEL_*``, ``PROMETHEUS_*``), a platform without ``os.fork`` or
pidfds, and ``LEDON_TEST_FORKSERVER=0`` in the environment of the test run.

Protocol: the test process and the server share a SOCK_SEQPACKET socket pair; a spawn
is one message (JSON: argv, cwd, env) carrying four descriptors (stdin, stdout,
stderr, and one end of a fresh socket pair on which the forking process answers with
the child's pid, then with its exit status). A zygote gets the requests of its
environment from the server the same way. The server and its zygotes end when the
test process closes their stdin (its end of a pipe), killing any child still running.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve()

#: Every child imports these (Django and the libraries it loads before the settings,
#: the database drivers), where installed; none of them reads a setting or the
#: environment on import, or registers anything (Django's tasks framework registers
#: its system checks when imported: the zygote imports it if the project does).
PRELOAD = [
    "django",
    "django.conf",
    "django.core.management",
    "django.core.management.base",
    "django.core.management.commands.check",
    "django.core.management.commands.migrate",
    "django.core.management.commands.shell",
    "django.core.checks",
    "django.db",
    "django.db.models",
    "django.db.backends.sqlite3.base",
    "django.db.backends.postgresql.base",
    "django.db.migrations.executor",
    "django.db.migrations.autodetector",
    "django.db.migrations.loader",
    "django.contrib.admin",
    "django.contrib.admin.views.main",
    "django.contrib.auth.checks",
    "django.contrib.auth.hashers",
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.middleware",
    "django.contrib.messages.middleware",
    "django.contrib.staticfiles.handlers",
    "django.urls",
    "django.template.defaultfilters",
    "django.template.defaulttags",
    "django.template.loader_tags",
    "django.template.backends.django",
    "django.forms",
    "django.views.generic",
    "django.http",
    "django.utils.log",
    "django.core.mail",
    "django.core.mail.backends.locmem",
    "django.core.mail.backends.filebased",
    "django.core.serializers.json",
    "environ",
    "psycopg",
    "prometheus_client",
    "sqlparse",
    "asyncio",
    "concurrent.futures",
    "multiprocessing",
    "socketserver",
    "wsgiref.simple_server",
    "zoneinfo",
]

#: Variables the interpreter (or a preloaded library) reads as it starts; a spawn
#: whose environment differs from the server's in one of them is a plain process.
_STARTUP_PREFIXES = ("PYTHON", "LC_", "OTEL_", "PROMETHEUS_")
_STARTUP_NAMES = {"LANG", "LANGUAGE", "TZ"}
#: Read by the interpreter and applied again in each child.
_APPLIED = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"}
#: Read by nothing a child sets up: the test phase, and the test project's fault
#: specs (``testproject.faults`` reads them when a fault point is reached, and a spec
#: names the test's own marker files).
_UNKEYED = {"PYTEST_CURRENT_TEST", "JOBS_FAULT", "ORDERS_FAULT", "FULFILMENT_FAULT", "CHAOS_FAULT"}
#: Left out of the server's own environment (a child sets them as it asks).
_SERVER_UNSET = {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", *_APPLIED}

_MAX_ZYGOTES = 4
_MESSAGE = 1 << 20


def startup_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES) and k not in _APPLIED
    }


# --------------------------------------------------------------------------- test side


class ForkedProcess:
    """A child of the fork server, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, pid: int, reply: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._reply = reply
        self._lock = threading.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already ended and reaped: its status is on the way
            self._pidfd = None

    def _receive(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            self._reply.settimeout(timeout)
            try:
                data = self._reply.recv(_MESSAGE)
            except (TimeoutError, BlockingIOError):
                return None
            if not data:
                raise RuntimeError(f"the fork server lost process {self.pid}")
            self.returncode = int(json.loads(data)["returncode"])
            self._reply.close()
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
            return self.returncode

    def poll(self) -> int | None:
        return self._receive(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._receive(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        with self._lock:
            if self.returncode is not None or self._pidfd is None:
                return
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The server of one test process (see the module's docstring)."""

    def __init__(self) -> None:
        self.env = {k: v for k, v in os.environ.items() if k not in _SERVER_UNSET}
        self.startup = startup_variables(self.env)
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (kept for the server's life)
            "w+", prefix="ledon-forkserver-", suffix=".log"
        )
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), str(theirs.fileno())],
            cwd=HERE.parent,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=[theirs.fileno()],
        )
        theirs.close()

    def accepts(self, argv: list[str], env: Mapping[str, str]) -> bool:
        return (
            self.proc.poll() is None
            and len(argv) >= 2
            and argv[0] == sys.executable
            and not argv[1].startswith("-")
            and startup_variables(env) == self.startup
        )

    def spawn(
        self, argv: list[str], cwd: Path, env: Mapping[str, str], stdout: int, stderr: int
    ) -> ForkedProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": dict(env)}).encode()
        try:
            with self._lock:
                socket.send_fds(self._control, [request], [0, stdout, stderr, theirs.fileno()])
        finally:
            theirs.close()
        ours.settimeout(120)
        data = ours.recv(_MESSAGE)
        if not data:
            self._log.seek(0)
            raise RuntimeError(f"the fork server did not start a child:\n{self._log.read()}")
        answer = json.loads(data)
        if "error" in answer:
            raise RuntimeError(f"the fork server could not start {argv}: {answer['error']}")
        return ForkedProcess(int(answer["pid"]), ours)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._control.close()
        self._log.close()


_server: ForkServer | None = None
_server_pid = 0
_server_lock = threading.Lock()


def _forkserver() -> ForkServer | None:
    global _server, _server_pid
    if os.environ.get("LEDON_TEST_FORKSERVER", "1") == "0" or not hasattr(os, "pidfd_open"):
        return None
    with _server_lock:
        if _server is None or _server_pid != os.getpid():
            import atexit

            _server, _server_pid = ForkServer(), os.getpid()
            atexit.register(_server.close)
        return _server


def spawn(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdout: IO[Any] | int,
    stderr: IO[Any] | int,
    real: bool = False,
) -> ForkedProcess | subprocess.Popen[bytes]:
    """Start ``argv`` (``[sys.executable, SCRIPT, ARG …]``) with ``env`` in ``cwd``, its
    output to the files ``stdout`` and ``stderr`` (``subprocess.STDOUT``: with stdout).
    A child of the fork server unless ``real`` or the spawn needs a fresh interpreter
    (module docstring); either way a real process of its own."""
    server = None if real else _forkserver()
    if server is not None and server.accepts(argv, env):
        out = stdout if isinstance(stdout, int) else stdout.fileno()
        err = out if stderr == subprocess.STDOUT else stderr
        err = err if isinstance(err, int) else err.fileno()
        return server.spawn(argv, cwd, env, out, err)
    return subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=stdout, stderr=stderr)


# --------------------------------------------------------------------------- server side


class _Child(Exception):
    """Raised in a freshly forked child: unwinds the server's stack to ``main``."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request


class _Server:
    """The loop of the server and of each zygote: requests in, children out."""

    def __init__(self, control: socket.socket, *, zygotes: bool) -> None:
        self.control: socket.socket | None = control
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ, "control")
        self.selector.register(0, selectors.EVENT_READ, "stdin")
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd: (pid, reply)
        # Zygotes by environment, and those told to end once their children have.
        self.zygotes: dict[str, tuple[int, int, socket.socket]] | None = {} if zygotes else None
        self.ending: dict[int, tuple[int, socket.socket]] = {}  # pidfd: (pid, control)
        self.no_zygote: set[str] = set()

    def release(self) -> None:
        """In a child: close everything of the server (the child keeps only 0, 1, 2)."""
        self.selector.close()
        if self.control is not None:
            self.control.close()
        for pidfd, (_pid, sock) in [*self.children.items(), *self.ending.items()]:
            sock.close()
            os.close(pidfd)
        for _pid, pidfd, sock in (self.zygotes or {}).values():
            sock.close()
            os.close(pidfd)

    def run(self) -> None:
        while self.control is not None or self.children or self.zygotes or self.ending:
            for key, _events in self.selector.select():
                if key.data == "control":
                    self.receive()
                elif key.data == "stdin":
                    if not os.read(0, 4096):
                        self.stop()
                        return
                else:
                    self.reap(key.fd)

    def stop(self) -> None:
        """The test process is gone: kill what still runs, wait for every process."""
        for pidfd in self.children:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        zygotes = [(pid, pidfd) for pid, pidfd, _sock in (self.zygotes or {}).values()]
        for pid, pidfd in (
            [(pid, fd) for fd, (pid, _s) in self.children.items()]
            + [(pid, fd) for fd, (pid, _s) in self.ending.items()]
            + zygotes
        ):
            os.waitpid(pid, 0)  # a zygote sees the same end of its stdin and ends
            os.close(pidfd)

    def receive(self) -> None:
        assert self.control is not None
        try:
            message, fds, _flags, _addr = socket.recv_fds(self.control, _MESSAGE, 8)
        except ConnectionResetError:
            message, fds = b"", []
        if not message:  # the asking side is gone: finish the children, then end
            self.selector.unregister(self.control)
            self.control.close()
            self.control = None
            return
        request = json.loads(message)
        if self.zygotes is not None:
            key = json.dumps(sorted((k, v) for k, v in request["env"].items() if k not in _UNKEYED))
            zygote = None
            if key not in self.no_zygote:
                zygote = self.zygotes.get(key) or self.start_zygote(key, request, fds)
            if zygote is not None:
                try:
                    socket.send_fds(zygote[2], [message], fds)
                except OSError:  # it ended in between: this server runs the child
                    self.no_zygote.add(key)
                else:
                    for fd in fds:
                        os.close(fd)
                    return
        self.fork_child(request, fds)

    def fork_child(self, request: dict[str, Any], fds: list[int]) -> None:
        reply = socket.socket(fileno=fds[3])
        try:
            pid = os.fork()
        except OSError as exc:
            reply.send(json.dumps({"error": str(exc)}).encode())
            reply.close()
            for fd in fds[:3]:
                os.close(fd)
            return
        if pid == 0:
            reply.close()
            self.release()
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            for fd in set(fds[:3]) - {0, 1, 2}:
                os.close(fd)
            raise _Child(request)
        for fd in fds[:3]:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, reply)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        reply.send(json.dumps({"pid": pid}).encode())

    def reap(self, pidfd: int) -> None:
        self.selector.unregister(pidfd)
        for key, (pid, zygote_fd, sock) in list((self.zygotes or {}).items()):
            if zygote_fd == pidfd:  # a zygote that failed: its environment goes without
                assert self.zygotes is not None
                del self.zygotes[key]
                self.no_zygote.add(key)
                self.ending[pidfd] = (pid, sock)
        if pidfd in self.ending:
            pid, sock = self.ending.pop(pidfd)
            os.waitpid(pid, 0)
            os.close(pidfd)
            sock.close()
            return
        pid, reply = self.children.pop(pidfd)
        _, status = os.waitpid(pid, 0)
        os.close(pidfd)
        with contextlib.suppress(OSError):  # OSError: the test process no longer listens
            reply.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
        reply.close()

    def start_zygote(self, key: str, request: dict[str, Any], fds: list[int]) -> Any:
        assert self.zygotes is not None
        if len(self.zygotes) >= _MAX_ZYGOTES:  # the oldest finishes its children, then ends
            pid, pidfd, sock = self.zygotes.pop(next(iter(self.zygotes)))
            sock.shutdown(socket.SHUT_WR)
            self.ending[pidfd] = (pid, sock)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            self.release()
            for fd in fds:
                os.close(fd)
            _Zygote(theirs, request).run()  # raises _Child in each child, or exits
            os._exit(0)
        theirs.close()
        ours.settimeout(300)
        try:
            ready = ours.recv(_MESSAGE) == b"ready"
        except OSError:
            ready = False
        ours.settimeout(None)
        pidfd = os.pidfd_open(pid)
        if not ready:
            os.waitpid(pid, 0)
            os.close(pidfd)
            ours.close()
            self.no_zygote.add(key)
            return None
        self.selector.register(pidfd, selectors.EVENT_READ, "zygote")
        self.zygotes[key] = (pid, pidfd, ours)
        return self.zygotes[key]


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


class _Zygote:
    def __init__(self, control: socket.socket, request: dict[str, Any]) -> None:
        self.control = control
        self.request = request

    def run(self) -> None:
        ready = False
        try:
            ready = self.set_up()
        except BaseException:
            ready = False
        if not ready:
            self.control.send(b"not ready")
            os._exit(0)
        self.control.send(b"ready")
        _Server(self.control, zygotes=False).run()
        os._exit(0)

    def set_up(self) -> bool:
        before = _open_fds()
        with tempfile.TemporaryFile() as capture:
            saved = os.dup(1), os.dup(2)
            os.dup2(capture.fileno(), 1)
            os.dup2(capture.fileno(), 2)
            try:
                _become(self.request)
                import django
                from django.conf import settings
                from django.core.management import get_commands

                django.setup()
                __import__(settings.ROOT_URLCONF)
                for name, app in get_commands().items():
                    if not app.startswith("django."):
                        __import__(f"{app}.management.commands.{name}")
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            printed = os.fstat(capture.fileno()).st_size > 0
        threads = threading.active_count() > 1
        gc.collect()
        gc.freeze()
        return not (printed or threads or _open_fds() - before)


def _become(request: dict[str, Any]) -> None:
    """Take the spawn's environment, working directory, argv, path and stdio."""
    env: dict[str, str] = request["env"]
    argv: list[str] = request["argv"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    script = os.path.abspath(argv[1])
    sys.argv = argv[1:]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *extra, *_BASE_PATH]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw: Any = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            binary,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=not unbuffered and (raw.isatty() or fd == 2),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _serve(control_fd: int) -> dict[str, Any]:
    """Preload, then serve; returns (in a child only) the request it is to run."""
    import importlib

    for module in PRELOAD:
        with contextlib.suppress(ImportError):  # not installed here (an optional driver)
            importlib.import_module(module)
    gc.collect()
    gc.freeze()
    control = socket.socket(fileno=control_fd)
    try:
        _Server(control, zygotes=True).run()
    except _Child as child:
        return child.request
    sys.exit(0)


_BASE_PATH: list[str] = []

if __name__ == "__main__":
    _BASE_PATH = sys.path[1:]
    _request = _serve(int(sys.argv[1]))
    _become(_request)
    del _request
    runpy.run_path(sys.argv[0], run_name="__main__")
