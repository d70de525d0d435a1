"""The instance's own tags, as its host changes them (aws): the one place a host calls EC2. A host can only remove
tags (its role's ec2:DeleteTags, on its sweep's instances): a packed run's slot tag when it leaves, and a `prune:`
run's rung tags once its record has the value at that rung (contract.RUNGS_TAG), which is how the controller knows
to read the record at its next pass without reading it at every pass.
"""

from __future__ import annotations

import functools
import logging
import os

from orchestrator.contract import RUNG_TAG

log = logging.getLogger("orch.agent")
CALL_TIMEOUT_S = 10.0  # a slow EC2 must not hold an ending agent (and its instance's bill) for botocore's 60 s a try


@functools.lru_cache(maxsize=1)
def _instance() -> tuple[str, str]:
    """(instance id, region) of this host, from its metadata service (asked once)."""
    from orchestrator.host.aws.imds import imds_get, own_instance_id

    region = imds_get("placement/region") or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    return own_instance_id(), region


def remove_own(tags: dict[str, str | None]) -> None:
    """Remove these tags from this instance; a tag with a value only while it still has that value."""
    from orchestrator.store.clients import client

    instance_id, region = _instance()
    client("ec2", region, max_attempts=3, read_timeout=CALL_TIMEOUT_S).delete_tags(
        Resources=[instance_id], Tags=[{"Key": k, **({} if v is None else {"Value": v})} for k, v in tags.items()]
    )


class RungTags:
    """Removes the rung tag of each rung the run's record reports a value at, once, on a thread of its own: the
    record is written under the reporter's lock, which a slow or throttled EC2 must not hold up (a notice's
    checkpoint waits on it). A failed removal is tried again with the next record; until it lands, the controller
    still reads the record every REREAD_S."""

    def __init__(self) -> None:
        import threading

        self.wanted: set = set()  # rungs some written record has a value at
        self.removed: set = set()
        self.busy = threading.Lock()  # held while a removal is under way

    def recorded(self, at_rungs: dict[str, float]) -> None:
        import threading

        self.wanted.update(at_rungs)
        if self.wanted - self.removed and self.busy.acquire(blocking=False):
            threading.Thread(target=self._remove, daemon=True, name="orch-untag").start()

    def _remove(self) -> None:
        """Holding `busy`: remove what is wanted, again while more came meanwhile; stop at a failure."""
        while True:
            rungs = sorted(self.wanted - self.removed)
            try:
                remove_own({RUNG_TAG + rung: None for rung in rungs})
                self.removed.update(rungs)
            except Exception as exc:  # the tags stay: the controller reads the record at its next reread instead
                log.warning(
                    "could not remove this instance's tags of rungs %s (%s); trying again with the next record",
                    rungs,
                    exc,
                )
                self.busy.release()
                return
            self.busy.release()
            if not self.wanted - self.removed or not self.busy.acquire(blocking=False):
                return
