"""The cloud-config user data every orch instance boots with: pinned host key, the user's key, safety-net shutdown.

The safety net is a script in cloud-init's per-boot folder, not a `runcmd`: runcmd runs once per instance, and
a `shutdown -h +N` it scheduled is lost when the instance reboots (CreateImage reboots `orch ami build`'s builder;
EC2 maintenance or a user may reboot any host). The script runs at every boot and powers off at one absolute
deadline, so a reboot neither removes the net nor extends it. It is baked into images built from a builder, so
it acts only on the instance it was written for: an instance launched from such an image gets orch's user data
again (a new deadline) or, launched by anything else, removes the script and keeps running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

log = logging.getLogger("orch.aws")

SAFETY_NET = "/var/lib/cloud/scripts/per-boot/orch-safety-net"  # cloud-init runs this folder at every boot
SAFETY_NET_OWNER = "/var/lib/orch/safety-net.owner"  # the instance the script was written for
SAFETY_NET_SCRIPT = """#!/bin/sh
# orch's safety net: power off at the deadline, on every boot of the instance this was written for.
deadline={deadline}
owner={owner}
cloud_data=/var/lib/cloud/data
id=$(cat "$cloud_data/instance-id" 2>/dev/null)
[ -s "$owner" ] || echo "$id" > "$owner"
if [ "$(cat "$owner")" != "$id" ]; then rm -f "$0" "$owner"; exit 0; fi
left=$(( (deadline - $(date +%s)) / 60 ))
[ "$left" -ge 1 ] || left=1
shutdown -h "+$left"
"""


def safety_net(max_minutes: int, now: float | None = None) -> str:
    """The per-boot script: `shutdown -h` at `max_minutes` after now (at least a minute from each boot)."""
    deadline = int((time.time() if now is None else now) + max_minutes * 60)
    return SAFETY_NET_SCRIPT.format(deadline=deadline, owner=SAFETY_NET_OWNER)


def cloud_config(
    host_private: str,
    host_public: str,
    user_public: str | Sequence[str],
    max_minutes: int,
    now: float | None = None,
) -> str:
    """User data: the pinned host key, the user's key(s) (a remote controller's hosts accept its own key and the
    laptop's), and the safety-net shutdown (written for this instance: an empty owner file, claimed at its first
    boot)."""
    import yaml

    keys = [user_public] if isinstance(user_public, str) else list(user_public)
    doc = {
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": host_private, "ed25519_public": host_public},
        "ssh_authorized_keys": keys,
        "write_files": [
            {"path": SAFETY_NET, "permissions": "0755", "owner": "root:root", "content": safety_net(max_minutes, now)},
            {"path": SAFETY_NET_OWNER, "permissions": "0644", "owner": "root:root", "content": ""},
        ],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)
