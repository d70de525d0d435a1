"""One run's layout and contract: names, paths, environment, the agent's start and the stop protocol.

Used by every backend and defined nowhere else. A backend supplies only primitives (run a shell
command on the host, put a file there, list hosts); what a run *is* comes from here.

On a host, a run lives under `<base>/<sweep>/<run>/`: `run/` is $ORCH_RUN_DIR (the command's
folder, synced to the store) and `ctl/` is the agent's private folder (task file, wrapper script,
pids, exit code, logs). Files in `ctl/` that others write to talk to the agent:
`stop-reason` (then SIGTERM to the pid in `agent.pid`) and `spot-notice`.

What the command writes in its metrics lines is read on both sides alike: `finite` says which values
are numbers, `default_mode` which way a metric improves.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the agent imports this module on hosts; keep pydantic out of its start-up
    pass

STOP_REASON_FILE = "stop-reason"  # written by whoever stops the run, before signalling the agent
NOTICE_FILE = "spot-notice"  # `orch chaos interrupt` (and tests) deliver a spot notice here
AGENT_PID_FILE = "agent.pid"
AGENT_LOG_FILE = "agent.log"
# The agent's sign of life on its own host, free to read there (the local backend does): touched every beat,
# holding the version of the run's record the agent wrote last (so a reader knows when the record changed).
REPORTED_FILE = "reported"
REMOTE_BASE = "~/orch/runs"  # where runs live on an instance
REMOTE_TMUX_SOCKET = "orch"
AUTO = "auto"  # `resources:` gpus / procs_per_node: the host decides (its GPUs)


# --- a metrics line's values (the command writes them; every reader of them agrees on these) ---


def finite(value: Any) -> float | None:
    """A metric's value as a float when it is a real, finite number; None for anything else (true/false,
    NaN, infinities, text, null), which no comparison, best-of or plot takes part in."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float: no value, never a crash
        return None
    return number if math.isfinite(number) else None


def default_mode(metric: str) -> str | None:
    """Which way a metric improves when the sweep does not say: max for names ending in acc (accuracy),
    min for names ending in loss; None when neither."""
    return "max" if metric.endswith("acc") else "min" if metric.endswith("loss") else None


def keep_best(best: dict[str, float], metric: str, value: float) -> None:
    """Fold one value into `best` (the best so far of each metric that has a default mode)."""
    mode = default_mode(metric)
    if mode is not None:
        best[metric] = value if metric not in best else (max if mode == "max" else min)(best[metric], value)


# --- S3 bucket names (a store, a `data:` source, `orch data push`, `orch aws policy`: one rule for all) ---

# S3's rules for general purpose buckets (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
_BUCKET_CHARS = re.compile(r"^[a-z0-9.-]+$")
_IP_LIKE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3")


def bucket_problem(name: str) -> str | None:
    """Why S3 would refuse `name` as a bucket's, in words; None for a valid name."""
    if not 3 <= len(name) <= 63:
        return f"a bucket name has 3 to 63 characters ({len(name)} here)"
    if not _BUCKET_CHARS.match(name):
        return "a bucket name holds only lowercase letters, digits, '.' and '-'"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "a bucket name begins and ends with a letter or digit"
    if ".." in name:
        return "a bucket name has no two dots in a row"
    if _IP_LIKE.match(name):
        return "a bucket name may not look like an IP address"
    for prefix in _RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"S3 reserves bucket names that start with {prefix!r}"
    for suffix in _RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return f"S3 reserves bucket names that end with {suffix!r}"
    return None


def session_prefix(sweep: str) -> str:
    return f"orch_{sweep}_"


def session_name(sweep: str, run_id: str) -> str:
    """tmux treats '.' and ':' in targets as separators."""
    return session_prefix(sweep) + run_id.replace(".", "_").replace(":", "_")


def run_root(base: str, sweep: str, run_id: str) -> str:
    return f"{base.rstrip('/')}/{sweep}/{run_id}"


def ctl_dir(base: str, sweep: str, run_id: str) -> str:
    """The agent's private folder of a run on its host."""
    return f"{run_root(base, sweep, run_id)}/ctl"


def code_dir(base: str, digest: str) -> str:
    """Where a `workdir:` snapshot is unpacked on a host, once for all its runs (no sweep's name starts with '.')."""
    return f"{base.rstrip('/')}/.code/{digest}"


def task_file(ctl_dir: str, attempt: int) -> str:
    """Where an attempt's task lies on its host, for its agent (RunTask.to_json)."""
    return f"{ctl_dir.rstrip('/')}/task-{attempt}.json"


def sh_path(path: str) -> str:
    """A path as one shell word; `~/...` stays expandable (as "$HOME/...")."""
    if path.startswith("~/"):
        return (
            '"$HOME/' + path[2:].replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'
        )
    return shlex.quote(path)


def agent_command(python: str, task_file: str, ctl_dir: str, pythonpath: str | None = None) -> str:
    """The shell command that runs the agent for a task; its own output goes to ctl/agent.log."""
    prefix = f"PYTHONPATH={sh_path(pythonpath)} " if pythonpath else ""
    return (
        f"{prefix}{shlex.quote(python)} -m orchestrator.host.agent {sh_path(task_file)} "
        f"2>&1 | tee -a {sh_path(ctl_dir + '/' + AGENT_LOG_FILE)}"
    )


def stop_script(ctl_dir: str, session: str, reason: str, wait_s: float, tmux_socket: str) -> str:
    """The stop protocol, as the host runs it: say why, SIGTERM the agent, wait for its session to end.

    `reason` is a StopReason (store/lifecycle.py; this module sits below the store): the agent reads it
    back as one, and an unknown one is an error it logs.

    Exit 0: it ended. Exit 3: the session was still there after wait_s (the caller may kill it).
    """
    ctl = ctl_dir.rstrip("/")
    return (
        f"echo {shlex.quote(str(reason))} > {sh_path(ctl + '/' + STOP_REASON_FILE)}; "
        f'kill -TERM "$(cat {sh_path(ctl + "/" + AGENT_PID_FILE)} 2>/dev/null)" 2>/dev/null; '
        f"for i in $(seq {max(1, int(wait_s * 10))}); do "
        f"tmux -L {shlex.quote(tmux_socket)} has-session -t {shlex.quote('=' + session)} 2>/dev/null || exit 0; sleep "
        "0.1; done; exit 3"
    )


def notice_path(ctl_dir: str) -> str:
    return f"{ctl_dir.rstrip('/')}/{NOTICE_FILE}"


# A `prune:` run alone on its instance: RUNGS_TAG says the instance signals its rungs, and one rung_tag(r) per rung
# is there until the run's record has its value at r (the agent removes it then). The controller lists instances at
# every pass anyway (DescribeInstances is free): it reads a run's record when a tag went, not every pass.
RUNGS_TAG = "orch:rungs"
RUNG_TAG = "orch:rung:"
MAX_RUNG_TAGS = 40  # the cloud allows 50 tags a resource; orch's own take 6


def rung_tag(rung: float) -> str:
    return f"{RUNG_TAG}{rung:g}"


# Host-side parts a backend may switch on in its tasks (`RunTask.host_parts`); the agent (host/) has each.
HOST_NOTICES = "host_notices"  # interruption notices from the host's metadata service too, not only ctl/spot-notice
SELF_TERMINATE = "self_terminate"  # the agent ends its own host when the attempt ends
RUNG_TAGS = "rung_tags"  # the host carries rung_tag(r) per rung; the agent removes each once its value is reported
# a SIGTERM without orch's stop file is the scheduler taking the host back (Slurm: a requeue, a preemption, a node
# going down): the attempt ends interrupted (resumable, never a failure), not stopped
SCHEDULED = "scheduled"
HOST_PARTS = (HOST_NOTICES, SELF_TERMINATE, RUNG_TAGS, SCHEDULED)


@dataclass(frozen=True)
class RunTask:
    """Everything an agent needs to run one attempt of one run; written as JSON for the agent.

    Frozen: built once (orchestrator/sweep/tasks.py: new_task, and on_host for what only the acquired host
    decides), never changed after; a test checks that nothing changes its env, data or rungs either.
    """

    sweep: str  # sweep name
    run_id: str  # run id within the sweep
    attempt: int  # 1-based attempt number
    command: str  # shell command, placeholders already substituted
    store_url: str  # where status, metrics, logs and the run folder are synced
    run_dir: str  # ORCH_RUN_DIR on the host
    ctl_dir: str  # the agent's private folder on the host (script, pids, exit code)
    session: str  # tmux session the agent runs in; the command gets a window "run" in it
    env: dict[str, str] = field(default_factory=dict)  # environment of the command
    timeout_s: float | None = None  # stop and fail the command after this long
    heartbeat_s: float = 2.0  # status.json heartbeat period
    # with it: a beat rewrites status.json only this often (or when its state or a rung changed) and otherwise just
    # touches ctl/reported, for a backend that reads that file (local) on a store that bills each request
    record_s: float | None = None
    sync_s: float = 5.0  # run folder -> store period
    host: str = "localhost"  # shown in status
    # the host-side parts its backend switches on (HOST_PARTS); host/ ships them all, the backend names its own
    host_parts: list[str] = field(default_factory=list)
    idle_s: float | None = None  # without SELF_TERMINATE: the host ends once the run ended and idle this long
    replaces: str = ""  # host of the previous attempt when that one was preempted or lost
    notice_poll_s: float = 5.0  # how often the agent looks for a spot interruption notice
    data: list[dict[str, str]] = field(default_factory=list)  # [{"from", "to"}]: staged before the command starts
    nodes_here: int = 1  # local: the run's nodes all run on this host, as that many copies of the command
    node_hosts: int = 1  # hosts the attempt spans, one node each (its agents: node 0 reports, the others follow)
    node_rank: int = 0  # which of them this host is
    slot: int = -1  # packing: the slot (set of GPUs) this run holds on an instance shared with other runs; -1: none
    rungs_at: str = (
        ""  # prune: the metrics key of progress (`prune.at`); a line passing one of `rungs` is reported at once,
    )
    rungs: list[float] = field(default_factory=list)  # not at the next heartbeat (the controller decides at rungs)
    rungs_metric: str = ""  # prune: the metric compared; the agent reports its value at each rung
    # `workdir:`: the snapshot's digest (its key in the store) and the sha256 of its archive (checked before unpacking);
    # the folder it is unpacked to, the command's current directory (code_dir()); "" without a workdir
    code: str = ""
    code_sha256: str = ""
    code_dir: str = ""
    setup: str = ""  # `setup:`: run once per host and snapshot in code_dir, before the first command there
    work_key: str = ""  # the metrics key that counts work (aws: buying work); the agent reports the attempt's span

    def uses(self, part: str) -> bool:
        """Whether its backend switched the host-side part `part` (one of HOST_PARTS) on."""
        return part in self.host_parts

    def to_json(self) -> bytes:
        """The task as its agent reads it: the one way a task is written, for a local file or an instance."""
        return json.dumps(asdict(self), indent=2).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RunTask:
        return cls(**json.loads(data))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_bytes(self.to_json())

    @classmethod
    def load(cls, path: Path) -> RunTask:
        return cls.from_json(Path(path).read_bytes())
