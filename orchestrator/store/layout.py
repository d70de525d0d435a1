"""The store's layout: every key orch reads or writes in a store, and nowhere else.

```
<sweep>/sweep.json                         resolved spec, git revision, launch time
<sweep>/summary.json                       counts per state, spend, a compact row per run (orch status)
<sweep>/rungs.json                         pruning verdicts (the controller's)
<sweep>/cost.json                          the cost ledger (the controller's)
<sweep>/rates.json                         aws: measured work rates per attempt (the controller's)
<sweep>/earlier.json                       aws: what earlier sweeps in the store measured (the launch's)
.orch-work/<command key>/<at>.<sweep>      aws: an index of the store's sweeps by command (the launch's)
<sweep>/controller.json                    the controller's lease on the sweep
<sweep>/controller.log                     a remote controller's own log (`orch logs --controller`)
<sweep>/notify.json                        `notify:`'s outbox: each message, and per sink when it was delivered
<sweep>/.orch-touched/<run>/at             a run's record changed outside the controller
<sweep>/.orch-code/<digest>.tar.gz         `workdir:`'s snapshot, put once at launch; hosts unpack it once each
<sweep>/.orch-code/<digest>.json           its file list (name -> sha256), to name what changed on a relaunch
<sweep>/.orch/<run>/status.json            the run's record
<sweep>/.orch/<run>/logs/<attempt>.log     the command's stdout+stderr (node 0's)
<sweep>/.orch/<run>/node-logs/<node>/...   a follower node's logs
<sweep>/.orch/<run>/notices/<attempt>      a follower's spot notice, relayed to node 0
<sweep>/.orch/<run>/node-exits/<attempt>/<node>   a follower's exit code
<sweep>/.orch/<run>/node-ends/<attempt>    node 0 ends the attempt: the followers stop and sync their logs
<sweep>/.orch/<run>/node-done/<attempt>/<node>    a follower tried its last sync (node 0 records the end after)
<sweep>/<run>/                             the run folder: only what the command wrote
<sweep>/<run>/metrics.jsonl                one JSON object per line
<sweep>/<run>/ckpt/<step>/MANIFEST.json    written last: a checkpoint without one does not exist
```

orch's own records live beside the run folder, never in it, so nothing a command writes can
overwrite them. The run folder's inner names (`METRICS_FILE`, `CHECKPOINTS_DIR`, `MANIFEST_FILE`)
are also those of the folder on the host, which is synced to it. Standard library only (it ships
to hosts).
"""

from __future__ import annotations

from collections.abc import Iterable

RECORDS_DIR = ".orch"  # orch's records of every run of a sweep
TOUCHED_DIR = ".orch-touched"
CODE_DIR = ".orch-code"
NODE_LOGS_DIR = "node-logs"  # a follower's logs: in the store beside `logs/`, and so on a local run's host
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "ckpt"
MANIFEST_FILE = "MANIFEST.json"


# --- the sweep's own records -------------------------------------------------------------------


def sweep_key(sweep: str) -> str:
    """The resolved spec; a relaunch must match it, and status and collect by name read it."""
    return f"{sweep}/sweep.json"


def summary_key(sweep: str) -> str:
    return f"{sweep}/summary.json"


def rungs_key(sweep: str) -> str:
    return f"{sweep}/rungs.json"


def cost_key(sweep: str) -> str:
    return f"{sweep}/cost.json"


def controller_key(sweep: str) -> str:
    """The lease of the controller that holds the sweep (one per sweep)."""
    return f"{sweep}/controller.json"


def controller_log_key(sweep: str) -> str:
    """The log of the sweep's remote controller (`orch launch --remote`), uploaded by its supervisor."""
    return f"{sweep}/controller.log"


def code_key(sweep: str, digest: str) -> str:
    """`workdir:`'s snapshot (a gzipped tar), named by its contents' digest."""
    return f"{sweep}/{CODE_DIR}/{digest}.tar.gz"


def code_files_key(sweep: str, digest: str) -> str:
    """The snapshot's file list: {name: sha256}."""
    return f"{sweep}/{CODE_DIR}/{digest}.json"


def touched_prefix(sweep: str) -> str:
    return f"{sweep}/{TOUCHED_DIR}"


def touched_run_prefix(sweep: str, run_id: str) -> str:
    return f"{touched_prefix(sweep)}/{run_id}"


def touched_key(sweep: str, run_id: str) -> str:
    return f"{touched_run_prefix(sweep, run_id)}/at"


def touched_runs(sweep: str, keys: Iterable[str]) -> list:
    """The run ids whose marker is among `keys` (a listing of touched_prefix), in listing order."""
    base, tail = touched_prefix(sweep) + "/", "/at"
    return [key[len(base) : -len(tail)] for key in keys if key.startswith(base) and key.endswith(tail)]


# --- a run's records (orch's, beside the run folder) --------------------------------------------


def records_prefix(sweep: str, run_id: str) -> str:
    """Where orch keeps a run's own records (status, logs): beside the run folder, not in it."""
    return f"{sweep}/{RECORDS_DIR}/{run_id}"


def status_key(sweep: str, run_id: str) -> str:
    return f"{records_prefix(sweep, run_id)}/{STATUS_FILE}"


def recorded(sweep: str, keys: Iterable[str]) -> set[str]:
    """The run ids that have a status record among `keys` (a listing of records_prefix(sweep, ""))."""
    base, tail = records_prefix(sweep, ""), f"/{STATUS_FILE}"
    return {key[len(base) : -len(tail)] for key in keys if key.startswith(base) and key.endswith(tail)}


def logs_prefix(sweep: str, run_id: str) -> str:
    """Node 0's attempt logs, one `<attempt>.log` each."""
    return f"{records_prefix(sweep, run_id)}/logs"


def node_logs_prefix(sweep: str, run_id: str, node: int) -> str:
    """Where a follower's attempt logs go (node 0's are the run's logs)."""
    return f"{records_prefix(sweep, run_id)}/{NODE_LOGS_DIR}/{node}"


def log_key(sweep: str, run_id: str, attempt: int, node: int = 0) -> str:
    folder = node_logs_prefix(sweep, run_id, node) if node else logs_prefix(sweep, run_id)
    return f"{folder}/{attempt}.log"


def logged_attempts(sweep: str, run_id: str, keys: Iterable[str]) -> set[int]:
    """The attempts, of any node, whose log is among `keys` (a listing of records_prefix(sweep, run_id))."""
    base = records_prefix(sweep, run_id) + "/"
    found = set()
    for key in keys:
        rel = key[len(base) :] if key.startswith(base) else ""
        folder, _, name = rel.rpartition("/")
        if (
            (folder == "logs" or folder.startswith(f"{NODE_LOGS_DIR}/"))
            and name.endswith(".log")
            and name[:-4].isdigit()
        ):
            found.add(int(name[:-4]))
    return found


def relay_key(sweep: str, run_id: str, attempt: int) -> str:
    """Where a follower puts a spot notice for node 0 (one per attempt)."""
    return f"{records_prefix(sweep, run_id)}/notices/{attempt}"


def node_exit_key(sweep: str, run_id: str, attempt: int, node: int) -> str:
    """Where a follower whose command failed puts its exit code for node 0 (the attempt's exit)."""
    return f"{records_prefix(sweep, run_id)}/node-exits/{attempt}/{node}"


def node_end_key(sweep: str, run_id: str, attempt: int) -> str:
    """Where node 0 says it ends the attempt (its command exited, or a node failed, or it timed out): the followers
    stop their command and sync their logs before node 0 records the end."""
    return f"{records_prefix(sweep, run_id)}/node-ends/{attempt}"


def node_done_key(sweep: str, run_id: str, attempt: int, node: int) -> str:
    """Where a follower says it is done with the attempt: its last sync of its log was tried."""
    return f"{records_prefix(sweep, run_id)}/node-done/{attempt}/{node}"


# --- the run folder (what the command wrote) ----------------------------------------------------


def run_prefix(sweep: str, run_id: str) -> str:
    return f"{sweep}/{run_id}"


def metrics_key(sweep: str, run_id: str) -> str:
    return f"{run_prefix(sweep, run_id)}/{METRICS_FILE}"


def checkpoints_prefix(sweep: str, run_id: str) -> str:
    return f"{run_prefix(sweep, run_id)}/{CHECKPOINTS_DIR}"


def checkpoint_rel(step: int) -> str:
    """A checkpoint's folder inside the run folder, with its trailing slash (a prefix of its files)."""
    return f"{CHECKPOINTS_DIR}/{step}/"


def is_checkpoint(rel: str) -> bool:
    """Whether a path inside the run folder is a checkpoint's file (ckpt/<step>/...)."""
    return rel.startswith(f"{CHECKPOINTS_DIR}/")


def manifested_steps(sweep: str, run_id: str, keys: Iterable[str]) -> set[int]:
    """The steps whose checkpoint has its manifest among `keys` (a listing of checkpoints_prefix)."""
    base = checkpoints_prefix(sweep, run_id) + "/"
    steps = set()
    for key in keys:
        step, _, name = key[len(base) :].partition("/") if key.startswith(base) else ("", "", "")
        if name == MANIFEST_FILE and step.isdigit():
            steps.add(int(step))
    return steps


def study_key(sweep: str) -> str:
    """`search:`: the study — every trial asked and every value told (the controller's)."""
    return f"{sweep}/study.json"


def rates_key(sweep: str) -> str:
    """aws: the sweep's measured work rates per attempt (backends/aws/work.py; the controller's)."""
    return f"{sweep}/rates.json"


def earlier_key(sweep: str) -> str:
    """aws: the work rates and reclaims of earlier sweeps in the store, as the sweep's launch found them
    (backends/aws/earlier.py)."""
    return f"{sweep}/earlier.json"


WORK_DIR = ".orch-work"  # no sweep's name: a name starts with a letter or digit


def work_index_prefix(command_key: str = "") -> str:
    """aws: the index of the store's sweeps (of one command key, when given): `orch aws rates --forget` deletes one."""
    return f"{WORK_DIR}/{command_key}/" if command_key else f"{WORK_DIR}/"


def work_index_key(command_key: str, at: int, sweep: str) -> str:
    return f"{WORK_DIR}/{command_key}/{at}.{sweep}"


def work_index_entries(keys: Iterable[str]) -> list[tuple[str, int, str]]:
    """(command key, at, sweep) of each index key, newest first; keys that are not such entries are passed over."""
    out = []
    for key in keys:
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != WORK_DIR:
            continue
        at, dot, sweep = parts[2].partition(".")
        if dot and at.isdigit() and sweep and "." not in sweep:
            out.append((parts[1], int(at), sweep))
    return sorted(out, key=lambda e: -e[1])


def notify_key(sweep: str) -> str:
    """`notify:`: the outbox — every message queued and, per sink, when it was delivered (the notifier's)."""
    return f"{sweep}/notify.json"
