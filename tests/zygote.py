"""The tests' `orch` calls, forked from a process that imported orch once (a fork server, as CPython's
multiprocessing has one), instead of a new interpreter each.

Why: the suite calls the CLI thousands of times (every `orch status --json` of a wait, every dry run of a refused
file), and each new interpreter spent ~0.5 s of CPU importing click, rich, pydantic's models, boto3 and orch before
it did anything — on two cores a suite-wide tax. A forked child starts with those modules imported and nothing else
shared: it is a process of its own (its own pid, environment, working directory, stdout and stderr, exit status), runs
`python -m orchestrator.cli ARGS` as the interpreter would (runpy, then the interpreter's own exit steps: non-daemon
threads joined, atexit run, streams flushed), and a stuck one still dumps every thread's stack on SIGABRT
(faulthandler, as `-X faulthandler` does).

Protocol (a Unix socket per server): the caller sends one JSON line {args, env, cwd} with its stdout and stderr pipes'
write ends (SCM_RIGHTS); the server forks and forgets (SIGCHLD ignored: the kernel reaps); the child answers on the
same connection `pid N` at once and `exit N` at its end. A connection closed without `exit` means the child died of a
signal. The server never runs a thread of its own, so a fork never copies a lock held elsewhere.

The `orch` server also reads botocore's data files once (_warm_botocore): a new interpreter parses them for each
client it makes.

Two kinds, a server each per worker: `orch` (tests/conftest.py's Orch) and the bundled trainer
(tests/unit/trainer/test_train.py's run_trainer: torch imported once). A call whose shaping variables (PYTHON*; for
the trainer also the thread and torch variables) differ from the server's gets a new interpreter;
ORCH_TEST_ZYGOTE=0 turns both off (each call a new interpreter again).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Kind:
    """What a fork server runs (`python -m MODULE ARGS`), what it imports first, and which variables shape an
    interpreter (or what it imported) before it runs anything: a call whose values differ gets a new interpreter."""

    module: str
    preload: tuple[str, ...]
    shaping: tuple[str, ...] = ("PYTHON",)  # prefixes
    warm: tuple[str, ...] = ()  # AWS services whose botocore data files the server reads once (_warm_botocore)


ORCH = Kind(
    "orchestrator.cli",
    (
        "orchestrator.cli.main",
        "orchestrator.cli.status",
        "orchestrator.cli.launch",
        "orchestrator.cli.ops",
        "orchestrator.cli.runs",
        "orchestrator.cli.aws",
        "orchestrator.backends.aws.backend",
        "boto3",
        "botocore.session",
    ),
    warm=("ec2", "s3", "iam", "sts", "kms"),  # every service orch makes a client of
)
# The bundled trainer (tests/unit/trainer's run_trainer): `import torch` is ~2.4 s of CPU a process. Importing it
# starts no thread (an OpenMP pool forked mid-use would hang the child); the threads' variables and torch's own are
# read as it is imported or first used, so they shape the server.
TRAINER = Kind(
    "trainer",
    ("torch", "trainer.train", "trainer.data", "trainer.models", "trainer.checkpoint"),
    ("PYTHON", "OMP_", "MKL_", "TORCH", "CUDA", "KMP_"),
)
KINDS = {"orch": ORCH, "trainer": TRAINER}


def _child(conn: socket.socket, request: dict, fds: list[int], module: str) -> None:
    """In the forked child: become `python -m MODULE ARGS` and end as the interpreter would."""
    import atexit
    import runpy
    import threading
    import traceback

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (the server's SIG_IGN: the CLI waits for its own children)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    conn.sendall(f"pid {os.getpid()}\n".encode())
    sys.argv = ["-m", *request["args"]]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter prints for an exception nobody caught
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # (the interpreter's exit: non-daemon threads joined,
    atexit._run_exitfuncs()  # then atexit; then the streams flushed)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a stream already closed: nothing left to flush)
            stream.flush()
    conn.sendall(f"exit {code}\n".encode())
    os._exit(code & 0xFF)


def _warm_botocore(services: tuple[str, ...]) -> None:
    """botocore's data files (each service's model, rules, paginators; the endpoints and partitions), read once here
    and kept by one loader that every new botocore session of a child uses. A new interpreter reads and parses
    those JSON files again for each process: a forked `orch status --json` of a sweep on the fake cloud took
    0.40 s of the machine's CPU without this, 0.17 s with it (20 calls, /proc/stat). The files and what is made of
    them are the same; a call whose AWS_DATA_PATH is set (where botocore looks for them) gets a loader of its own,
    as botocore would make it."""
    import botocore.session
    from botocore import loaders

    loader = loaders.create_loader()
    session = botocore.session.get_session()
    session.register_component("data_loader", loader)
    for service in services:  # making a client reads all its files; the names only satisfy the signer
        session.create_client(service, region_name="us-east-1", aws_access_key_id="-", aws_secret_access_key="-")
    made = botocore.session.create_loader

    def create_loader(search_path_string=None):
        return made(search_path_string) if search_path_string else loader

    botocore.session.create_loader = create_loader  # what a Session calls for its data_loader component


def serve(path: str, kind: str = "orch") -> None:
    """The server: preload, then fork a child per request until the process that started it ends."""
    import faulthandler
    import importlib

    faulthandler.enable()
    for name in KINDS[kind].preload:
        importlib.import_module(name)
    if KINDS[kind].warm:
        _warm_botocore(KINDS[kind].warm)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    server.settimeout(2.0)
    parent = os.getppid()
    print("ready", flush=True)
    while os.getppid() == parent:  # it ends with the process that started it
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 2)
        while not data.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                break
            data += more
        if os.fork() == 0:
            server.close()
            _child(conn, json.loads(data), fds, KINDS[kind].module)
        for fd in fds:
            os.close(fd)
        conn.close()


class Zygote:
    """A fork server for this process's calls of one kind (`orch`, the trainer), started at the first one."""

    def __init__(self, env: dict[str, str], kind: str = "orch"):
        self.folder = tempfile.mkdtemp(prefix="orch-zygote-")
        self.path = os.path.join(self.folder, "s")
        self.kind = KINDS[kind]
        self.shaping = _shaping(env, self.kind)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-c",
                f"from tests.zygote import serve; serve({self.path!r}, {kind!r})",
            ],
            env=env,
            cwd=self.folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the tests' orch fork server did not start")
        atexit.register(self.close)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def fits(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and _shaping(env, self.kind) == self.shaping

    def run(self, args, env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str, str, bool]:
        """(exit status, stdout, stderr, timed out); the exit status is -SIGNAL for a child a signal ended."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            request = json.dumps({"args": list(args), "env": env, "cwd": str(cwd)}).encode() + b"\n"
            socket.send_fds(conn, [request], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        return _collect(conn, out_r, err_r, timeout)


def _collect(conn: socket.socket, out_r: int, err_r: int, timeout: float) -> tuple[int, str, str, bool]:
    import selectors

    said_fd = conn.fileno()
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: [], said_fd: []}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    deadline, pid, aborted = time.monotonic() + timeout, None, False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0 and not aborted and pid is not None:
            os.kill(pid, signal.SIGABRT)  # faulthandler prints every thread's stack
            aborted = True
        for key, _ in sel.select(timeout=max(0.1, left) if not aborted else 1.0):
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fd)
                continue
            chunks[key.fd].append(data)
            if key.fd == said_fd and pid is None and b"\n" in b"".join(chunks[key.fd]):
                pid = int(b"".join(chunks[key.fd]).split(b"\n")[0].split()[1])
    conn.close()
    os.close(out_r)
    os.close(err_r)
    said = b"".join(chunks[said_fd]).decode().split()
    code = int(said[3]) if len(said) >= 4 and said[2] == "exit" else (-signal.SIGABRT if aborted else -signal.SIGKILL)
    return code, _text(chunks[out_r]), _text(chunks[err_r]), aborted


def _text(chunks: list[bytes]) -> str:
    """As subprocess's text mode reads a pipe: the locale's encoding, universal newlines."""
    import locale

    return b"".join(chunks).decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _shaping(env: dict[str, str], kind: Kind) -> dict[str, str]:
    """What shapes an interpreter (and what the server imported) before it runs anything."""
    return {k: v for k, v in env.items() if k.startswith(kind.shaping)}


_ZYGOTES: dict[str, Zygote] = {}


def zygote_for(env: dict[str, str], kind: str = "orch") -> Zygote | None:
    """This process's fork server of the kind, when it fits the call's environment (None: run a new interpreter)."""
    if os.environ.get("ORCH_TEST_ZYGOTE") == "0":
        return None
    if kind not in _ZYGOTES or _ZYGOTES[kind].proc.poll() is not None:
        _ZYGOTES[kind] = Zygote(env, kind)
    return _ZYGOTES[kind] if _ZYGOTES[kind].fits(env) else None
