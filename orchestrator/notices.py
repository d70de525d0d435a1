"""Where the agent learns that its host is going away: a spot interruption notice, or EC2's
rebalance recommendation (a warning that may come before one, or never).

On an instance both come from IMDS; anywhere, a notice also comes from the control file that
`orch chaos interrupt` writes (how the local backend and the tests interrupt a run).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .contract import NOTICE_FILE

log = logging.getLogger("orch.agent")


class NoticeSource:
    def __init__(self, ctl_dir: Path, imds: bool):
        self.ctl, self.imds = Path(ctl_dir), imds

    def notice(self) -> bool:
        """A spot interruption notice: the control file, or IMDS spot/instance-action."""
        return (self.ctl / NOTICE_FILE).exists() or self._imds("spot/instance-action")

    def rebalance(self) -> bool:
        return self._imds("events/recommendations/rebalance")

    def _imds(self, path: str) -> bool:
        if not self.imds:
            return False
        from .imds import imds_get

        try:
            return imds_get(path) is not None
        except OSError as exc:
            log.warning("IMDS %s: %s", path, exc)
            return False
