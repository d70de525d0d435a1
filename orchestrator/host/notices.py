"""Where the agent learns that its host is going away: a spot interruption notice, or EC2's
rebalance recommendation (a warning that may come before one, or never).

On an instance both come from IMDS; anywhere, a notice also comes from the control file that
`orch chaos interrupt` writes (how the local backend and the tests interrupt a run); on node 0 of
a run that spans several hosts, also from a notice another node relayed (nodes.Relay). And why the agent is asked
to stop: the stop file orch writes (`stop_reason`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from orchestrator.contract import NOTICE_FILE
from orchestrator.store.lifecycle import StopReason

log = logging.getLogger("orch.agent")


class NoticeSource:
    def __init__(self, ctl_dir: Path, imds: bool, relayed: Callable[[], bool] | None = None):
        self.ctl, self.imds, self.relayed = Path(ctl_dir), imds, relayed

    def notice(self) -> bool:
        """A spot interruption notice: the control file, IMDS spot/instance-action, or another node's."""
        return (
            (self.ctl / NOTICE_FILE).exists()
            or self._imds("spot/instance-action")
            or bool(self.relayed and self.relayed())
        )

    def rebalance(self) -> bool:
        return self._imds("events/recommendations/rebalance")

    def _imds(self, path: str) -> bool:
        if not self.imds:
            return False
        from orchestrator.host.aws.imds import imds_get

        try:
            return imds_get(path) is not None
        except OSError as exc:
            log.warning("IMDS %s: %s", path, exc)
            return False


# The stops of orch's that keep what the attempt wrote (docs/guides/pruning.md): `orch down`, `orch cancel`, a prune,
# and the controller's stop of the nodes left when a node of the attempt went.
KEPT_ON_STOP = (StopReason.STOPPED, StopReason.CANCELLED, StopReason.PRUNED, StopReason.LOST)


def kept_stop(reason: StopReason, orchs_file: bool, scheduler_sigterm: bool) -> bool:
    """Whether a stop keeps what the command wrote (the agent syncs it before it records the end): orch's stop file
    asked one of KEPT_ON_STOP; or a scheduler's SIGTERM took the job back (Slurm: a requeue, a preemption; SIGKILL
    follows after its KillWait, 30 s by default), which keeps what the command wrote on it (its checkpoint) as orch's
    own stop does: no next attempt begins before this one records its end."""
    if scheduler_sigterm and reason == StopReason.INTERRUPTED:
        return True
    return orchs_file and reason in KEPT_ON_STOP


def stop_reason(path: Path, scheduled: bool = False, hangup: bool = False) -> StopReason:
    """Why the agent is asked to stop: the stop file's reason. No file: `lost` on a SIGHUP (its tmux session was
    killed: the host is gone, as a crash would take it, and it counts toward the quick losses that end a run), else
    `stopped` (a SIGTERM from someone else, e.g. a user's kill), or with `scheduled` `interrupted` (a scheduler ends
    jobs that way: contract.SCHEDULED). A reason this agent does not know (an orch of another version wrote it) is an
    error, logged, and then taken as `stopped`: resumable, never counted as a failure."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if hangup:
            return StopReason.LOST
        return StopReason.INTERRUPTED if scheduled else StopReason.STOPPED
    try:
        return StopReason.parse(text)
    except ValueError as exc:
        log.error("%s in %s: stopping as `orch down` would (the run resumes on the next launch)", exc, path)
        return StopReason.STOPPED
