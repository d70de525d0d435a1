"""What one attempt is made of, without state: the wrapper script its command runs in, how it ended
(a pure function, tested like the controller's decide()), and reading what it left behind.

Runs on the host (the agent imports it): standard library only.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from orchestrator.contract import RunTask, finite
from orchestrator.host.env import HostFacts
from orchestrator.store.layout import CHECKPOINTS_DIR, MANIFEST_FILE, NODE_LOGS_DIR
from orchestrator.store.lifecycle import Ending, RunState, StopReason

TAIL_LINES = 20
CLOCKS = ("elapsed_s", "elapsed", "time")  # the seconds a work rate is measured in: the first a line carries


def pid_file(what: str, attempt: int) -> str:
    """`cmd.<attempt>.pid`, `wrapper.<attempt>.pid`: one per attempt, so an agent of an earlier attempt that
    is still finishing (its tmux session was killed and the run restarted) never signals a later one."""
    return f"{what}.{attempt}.pid"


def wrapper_script(task: RunTask, here: HostFacts, env: dict[str, str], log_file: Path) -> str:
    """The script the "run" window executes: `env`, the command (in the workdir's snapshot, else the host's run
    folder), its exit code.

    No user text is ever spliced into shell syntax: values and the command are single
    shell-quoted words; the command is run as `bash -c "$2"` by a small bash that first records
    its own pid (the command keeps that pid through exec, so signals reach it). Output is teed to
    the log through a process substitution, so the exit code is recorded the moment the command
    exits, even while a child it left in the background still holds the output open; then the
    wrapper waits for the log's tee (the agent stops leftovers that keep it open).
    """
    ctl = here.ctl_dir
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    exit_file = shlex.quote(str(ctl / f"exit.{task.attempt}"))
    launcher = 'echo $$ > "$1"; exec bash -c "$2"'
    if task.nodes_here > 1:  # every node of the run on this host (local): one copy per node rank, signals forwarded
        launcher = NODES_LAUNCHER
    return f"""#!/usr/bin/env bash
# attempt {task.attempt}, written by the orch agent
{exports}
cd {shlex.quote(str(here.cwd))} || exit 97
echo $$ > {shlex.quote(str(ctl / pid_file("wrapper", task.attempt)))}
exec > >(tee -a {shlex.quote(str(log_file))}) 2>&1
tee_pid=$!
bash -c {shlex.quote(launcher)} orch-run {shlex.quote(str(ctl / pid_file("cmd", task.attempt)))} \
  {shlex.quote(task.command)} {shlex.quote(str(node_logs_dir(log_file)))} {task.attempt}
code=$?
echo $code > {exit_file}.tmp && mv {exit_file}.tmp {exit_file}
exec >&- 2>&-
wait $tee_pid  # the pane (and tmux's SIGHUP to it) must not end before the log is written
"""


def node_logs_dir(log_file: Path) -> Path:
    """Where the copies of a local run's other nodes write their logs: `<dir>/<node>/<attempt>.log`, beside the
    attempt's own `logs/` (node 0's), synced to the store where an aws follower's agent puts its node's log."""
    return log_file.parent.parent / NODE_LOGS_DIR


# N copies of the command, ORCH_NODE_RANK 0..N-1, as N node processes on one host; node 0's output is the attempt's
# log, node k's goes to "$3/k/$4.log" (node_logs_dir; $4 the attempt), as on aws each node's log is its own. SIGTERM,
# SIGINT and SIGHUP reach every copy. The first copy to fail ends the attempt: the others are stopped (their
# children first, then them) and the exit code is that first non-zero one (0 when all succeed) — a
# crashed node must not leave the rest waiting for it in a rendezvous until a timeout.
NODES_LAUNCHER = (
    'echo $$ > "$1"; pids=(); for k in $(seq 1 $((ORCH_NODES - 1))); do mkdir -p "$3/$k"; done; '
    'for k in $(seq 0 $((ORCH_NODES - 1))); do if [ "$k" -eq 0 ]; then ORCH_NODE_RANK=0 bash -c "$2" & '
    'else ORCH_NODE_RANK=$k bash -c "$2" >> "$3/$k/$4.log" 2>&1 & fi; pids+=($!); done; '
    'stop() { for q in "${pids[@]}"; do pkill -TERM -P "$q" 2>/dev/null; kill -TERM "$q" 2>/dev/null; done; }; '
    "trap stop TERM INT HUP; code=0; "
    'while [ ${#pids[@]} -gt 0 ]; do left=(); failed=0; for p in "${pids[@]}"; do '
    'if kill -0 "$p" 2>/dev/null; then left+=("$p"); else wait "$p"; c=$?; '
    'if [ "$c" -ne 0 ] && [ "$code" -eq 0 ]; then code=$c; failed=1; fi; fi; done; '
    'pids=("${left[@]}"); [ "$failed" -eq 1 ] && stop; [ ${#pids[@]} -gt 0 ] && sleep 0.2; done; exit $code'
)


def final_status(
    stop_requested: StopReason | None,
    noticed: bool,
    code: int | None,
    timeout_s: float | None,
    node_failed: tuple[int, int] | None = None,
    stage_error: str = "",
    unsynced: str = "",
    run_id: str = "",
    setup_error: str = "",
) -> Ending:
    """How an attempt ended: (state, reason, counts as a failure), from everything that decides it. Pure; tested like
    decide().

    An exit caused by a spot notice is a preemption whatever its code (a command without a
    SIGUSR1 handler dies of it); a timeout is a failure; a stop by orch ends as its reason says.
    `node_failed` (node, exit code): a follower's command failed, which is the attempt's failure; `stage_error`: the
    data could not be staged (the command never ran); `unsynced`: why a success's results never reached the store
    (then it is no success: they are only on the host); `setup_error`: the workdir could not be had or `setup:`
    failed (the command never ran; unless orch stopped it, that is the attempt's failure).
    """
    stop = None if stop_requested is None else StopReason(stop_requested)
    if stage_error:
        return Ending(RunState.FAILED, f"data staging failed: {stage_error}", True)
    if setup_error and stop is None:  # the workdir or `setup:` failed: the command never ran (it counts, as its own)
        return Ending(RunState.FAILED, setup_error, True)
    if stop is StopReason.NODE_FAILED and node_failed:
        node, node_code = node_failed
        return Ending(
            RunState.FAILED, f"node {node} exited with code {node_code} (`orch logs {run_id} --node {node}`)", True
        )
    ending = _ending(stop, noticed, code, timeout_s)
    if unsynced and ending.state == RunState.SUCCEEDED:
        return Ending(RunState.FAILED, unsynced, True)
    return ending


def _ending(stop: StopReason | None, noticed: bool, code: int | None, timeout_s: float | None) -> Ending:
    # the controller's verdict: whatever the exit, not ours
    if stop is not None and stop in (StopReason.SUPERSEDED, StopReason.LOST):
        return Ending(stop.to_state(), stop.words(), False)
    if stop is StopReason.TIMEOUT:
        return Ending(RunState.FAILED, f"timed out after {duration(timeout_s or 0)}", True)
    if noticed or stop is StopReason.INTERRUPTED:
        return Ending(RunState.INTERRUPTED, "", False)
    if stop is not None:
        return Ending(stop.to_state(), stop.words(), stop.failure)
    if code == 0:
        return Ending(RunState.SUCCEEDED, "", False)
    return Ending(
        RunState.FAILED, (f"exit code {code}" if code is not None else "command vanished without an exit code"), True
    )


def duration(seconds: float) -> str:
    """3 s, 90 s, 2.5 min: as a person reads a limit."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def write_private(path: Path, text: str) -> None:
    """A file only its owner may read (scripts and task files hold the run's whole environment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def newest_checkpoint(run_dir: Path) -> int | None:
    """Step of the newest checkpoint that has its manifest (ckpt/<step>/MANIFEST.json), if any."""
    steps = [
        int(p.parent.name) for p in run_dir.glob(f"{CHECKPOINTS_DIR}/*/{MANIFEST_FILE}") if p.parent.name.isdigit()
    ]
    return max(steps) if steps else None


def last_metrics(path: Path, max_bytes: int = 8 << 20) -> dict:
    """The newest line of a metrics file that parses, however wide (a line of per-class accuracies may be
    far over 16 KB): the window read from the end doubles until it holds one, up to `max_bytes`."""
    window = 16384
    while True:
        lines = tail(path, lines=5, max_bytes=window).splitlines()
        for line in reversed(lines):
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: a line nested deeper than Python parses
                continue
            if isinstance(obj, dict):
                return obj
        try:
            size = path.stat().st_size
        except OSError:
            return {}
        if window >= size or window >= max_bytes:
            return {}
        window *= 2


def recordable(line: dict) -> dict:
    """A metrics line as the run's record keeps it: NaN and infinities as the words nan, inf and -inf. Strict JSON
    has no such numbers (the store writes them as null, which `orch status` shows as nothing), and a diverged run
    must look diverged in the live view; a word is no value to a target or a rung, as NaN was not."""
    return {k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in line.items()}


class RungWatch:
    """The run's metrics file as it grows: read from where the last read ended (an offset), never again
    from the start, so a pass costs what was appended. It keeps the newest line (the record's
    `last_metrics`) and, with `prune:`, the metric on the first line at or past each rung that carries it
    (`at_rungs`): the controller compares runs at the same progress, however many lines came at once or
    however late the store's copy of the file is. A line that passes a rung is reported at once, not at
    the next heartbeat. Shared by the attempt's loop and the heartbeat thread."""

    CHUNK = 64 << 20  # bytes read at most per call (a longer line than this is skipped)

    def __init__(self, path: Path, at: str = "", rungs: Sequence[float] = (), metric: str = "", work_key: str = ""):
        import threading

        self.path, self.at, self.metric = path, at, metric
        # `work_key` (aws: buying work): the first and newest (work, seconds) of this attempt's own lines, from
        # `since` (the file's end when the command started: restored lines are earlier attempts')
        self.work_key, self.since, self.clock = work_key, None, ""
        self.work: list[float] = []
        self.pending = sorted(rungs)  # rungs without a value yet
        self.offset = 0  # bytes of the file read
        self.newest: dict = {}
        self.at_rungs: dict[str, float] = {}
        self.metric_seen = False  # a line carried the metric (a `prune:` metric no line has is warned about)
        self.lock = threading.Lock()

    def passed(self) -> bool:
        """Read what was appended; True when it gave a rung its value (the record should say so now)."""
        if not self.pending:
            return False
        with self.lock:
            before = len(self.at_rungs)
            self._read()
            return len(self.at_rungs) > before

    def begin_attempt(self) -> None:
        """The command starts: lines from here on are this attempt's (its work rate is measured on them)."""
        with self.lock:
            self._read()
            self.since, self.work, self.clock = self.offset, [], ""

    def report(self, status) -> None:
        """Into the record: the newest line and, with rungs, the values at them; with a work key, the attempt's
        first and newest (work, seconds)."""
        with self.lock:
            self._read()
            status.last_metrics = recordable(self.newest)
            if self.at and (self.pending or self.at_rungs):
                status.at_rungs, status.metric_seen = dict(self.at_rungs), self.metric_seen
            if len(self.work) == 4:
                status.work = list(self.work)

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:  # replaced (a restore): read it again from its start
                    self.offset = 0
                f.seek(self.offset)
                data = f.read(min(self.CHUNK, size - self.offset))
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        at = self.offset
        for raw in data[:end].split(b"\n")[:-1]:
            self._line(raw, at)
            at += len(raw) + 1
        rest = data[end:]
        # a last line without its newline: taken when it parses (a JSON object is whole once it parses),
        # else left for the next read; one that fills a whole read can never end and is skipped
        if rest and (self._line(rest, at) or len(data) == self.CHUNK and not end):
            end = len(data)
        self.offset += end

    def _line(self, raw: bytes, at: int = 0) -> bool:
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            return False
        if not isinstance(line, dict):
            return False  # (a number may be the start of a longer one)
        self.newest = line
        if self.work_key and self.since is not None and at >= self.since:
            self._work(line)
        value = finite(line.get(self.metric)) if self.metric else None
        self.metric_seen = self.metric_seen or value is not None
        progress = finite(line.get(self.at)) if self.at else None
        if progress is None or value is None:
            return True
        while self.pending and self.pending[0] <= progress:
            self.at_rungs[f"{self.pending.pop(0):g}"] = value
        return True

    def _work(self, line: dict) -> None:
        """Fold one of the attempt's lines into its (work, seconds) span: the first and the newest, one clock."""
        work = finite(line.get(self.work_key))
        clock = self.clock or next((k for k in CLOCKS if finite(line.get(k)) is not None), "")
        seconds = finite(line.get(clock)) if clock else None
        if work is None or seconds is None:
            return
        self.clock = clock
        self.work = (self.work[:2] or [work, seconds]) + [work, seconds]


def checkpoint_ok(folder: Path) -> bool:
    """A checkpoint folder whose MANIFEST.json matches its files (sizes and sha256).

    The same check as trainer.checkpoint.verify, without torch: the agent runs on interpreters that may lack it.
    """
    from orchestrator.store.base import sha256_file

    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        files = manifest["files"]
        return all(
            (folder / name).stat().st_size == meta["size"] and sha256_file(folder / name) == meta["sha256"]
            for name, meta in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def usr1_targets(root: int) -> list[int]:
    """The processes of a command's tree that catch SIGUSR1, or the command itself when none does.

    Read from /proc (SigCgt); where there is no /proc, just the command.
    """
    import signal

    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return [root]
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    bit = 1 << (signal.SIGUSR1 - 1)
    catchers = [pid for pid in tree if _caught(pid) & bit]
    return catchers or [root]


def group_runs(group: int) -> bool:
    """Whether a process of this process group still runs. A zombie (exited, not yet reaped by its
    parent: the wrapper's parent is the tmux server, which may reap it seconds later) does not; where
    there is no /proc, any member counts."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state != "Z":
            return True
    return False


def _caught(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0
