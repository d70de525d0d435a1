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
