"""The run folder and the store, on the host: restore it as the last attempt left it (with its newest checkpoint
that verifies), stage the sweep's `data:`, sync it up, and whether a stop keeps what the command wrote.

The agent (host/agent.py) calls these and keeps the record; each byte moved is told to its reporter through
`count`. Runs on the host (the agent imports it): standard library, store/ and contract.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.host.attempt import checkpoint_ok, node_logs_dir
from orchestrator.store import layout
from orchestrator.store.base import Store
from orchestrator.store.lifecycle import RunState
from orchestrator.store.status import read_status

log = logging.getLogger("orch.agent")

Count = Callable[..., None]  # the reporter's count(up=, down=): bytes moved, for the record


def restore(store: Store, task: RunTask, run_dir: Path, count: Count) -> None:
    """The run folder as the last attempt left it, with only its newest checkpoint that verifies.

    A host lost in the middle of a sync leaves files newer than the folder's index: the metrics file and
    the logs are then taken as the store has them (a newer file is still the run's); a checkpoint file
    that does not match is that checkpoint failing to verify, and an older one is tried."""
    prefix = layout.run_prefix(task.sweep, task.run_id)
    files = lambda rel: not layout.is_checkpoint(rel)  # noqa: E731
    got = store.sync_down(prefix, run_dir, only=files, stale_ok=files)
    count(down=got.bytes)
    if got.stale:
        log.warning(
            "the store's index of the run folder is older than %s (the last host was lost while it "
            "synced): taken as the store has them",
            ", ".join(got.stale),
        )
    keys = store.list(layout.checkpoints_prefix(task.sweep, task.run_id))
    for step in sorted(layout.manifested_steps(task.sweep, task.run_id, keys), reverse=True):
        folder = layout.checkpoint_rel(step)
        try:
            got = store.sync_down(prefix, run_dir, only=lambda rel, folder=folder: rel.startswith(folder))
            count(down=got.bytes)
        except OrchError as exc:  # a file of it that does not match what was uploaded
            log.warning("%s", exc)
        if checkpoint_ok(run_dir / folder):
            log.info("restored checkpoint step %s", step)
            return
        log.warning("checkpoint step %s in the store does not verify; trying an older one", step)


def stage(data: list, store: Store, log_file: Path, count: Count) -> str:
    """The sweep's data on this host before the command starts (once per host: what is there stays).
    What went wrong ("" when all is there): the attempt fails with it, and the run's log says so."""
    from orchestrator.host.staging import stage_all

    try:
        for r in stage_all(data, getattr(store, "client", None)):
            count(down=r.bytes)
            log.info("data %s -> %s: %d files, %d fetched (%.1f MB)", r.source, r.to, r.files, r.fetched, r.bytes / 1e6)
        return ""
    except OSError as exc:
        log.error("%s", exc)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as f:
            f.write(f"[orch] data staging failed: {exc}\n")
        return str(exc)


def sync_up(store: Store, task: RunTask, run_dir: Path, log_file: Path, count: Count) -> None:
    """The run folder and the attempt's log to the store; a follower node keeps only its log there (the run
    folder is node 0's)."""
    if task.node_rank > 0:
        store.sync_up(log_file.parent, layout.node_logs_prefix(task.sweep, task.run_id, task.node_rank), indexed=False)
        return
    _say_links_out(run_dir, log_file)
    up = store.sync_up(run_dir, layout.run_prefix(task.sweep, task.run_id), prune=layout.is_checkpoint).bytes
    logs = layout.logs_prefix(task.sweep, task.run_id)
    up += store.sync_up(log_file.parent, logs, indexed=False).bytes
    for node in range(1, task.nodes_here):  # a local run's other nodes: copies of the command on this host
        node_dir = node_logs_dir(log_file) / str(node)
        if node_dir.is_dir():
            up += store.sync_up(node_dir, layout.node_logs_prefix(task.sweep, task.run_id, node), indexed=False).bytes
    count(up=up)


_LINKS_SAID: dict[Path, list[str]] = {}  # run folder -> the links out of it the log last named


def _say_links_out(run_dir: Path, log_file: Path) -> None:
    """Links in the run folder that name something outside it are never synced: said in the run's log, once per
    change (what they name is not the run's: a link to ~/.ssh must never copy a key into the store)."""
    from orchestrator.store.base import links_out

    found = links_out(run_dir)
    if found and found != _LINKS_SAID.get(run_dir):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as f:
            f.write(f"[orch] not synced, links out of the run folder: {', '.join(found[:10])}\n")
    _LINKS_SAID[run_dir] = found


def keeps_what_it_wrote(store: Store, task: RunTask, kept_stop: bool, superseded: bool) -> bool:
    """Whether orch stopped this attempt in a way that keeps what its command wrote
    (docs/guides/pruning.md: a run orch stops keeps its folder and log): the run's record (read now, not the
    reporter's last write) ended with this attempt for good (pruned, cancelled: no attempt comes after it to
    write over), or `kept_stop`: orch's stop file asked (`orch down`, `orch cancel`, a prune) or a scheduler took the
    job back (SIGTERM, contract.SCHEDULED) while the record is still this attempt's; or the record says lost and
    orch's stop file says so too (a node of the attempt went: the controller stops the nodes left before it starts
    another attempt). Another stop (a host going down, someone's kill), a lost or superseded attempt keep nothing:
    another attempt may have begun."""
    try:
        record = read_status(store, task.sweep, task.run_id)
    except Exception as exc:
        log.warning("could not read the run's record (%s: %s); not syncing on the stop", type(exc).__name__, exc)
        return False
    if record.attempt != task.attempt:
        return False
    if record.state == RunState.LOST and kept_stop:  # a node went: the controller stops the others after its
        return True  # verdict and before any next attempt, as a prune
    return record.state in (RunState.PRUNED, RunState.CANCELLED) or (kept_stop and not superseded)
