"""The cloud-config user data every orch instance boots with: pinned host key, the user's key, safety-net shutdown."""

from __future__ import annotations

import logging

log = logging.getLogger("orch.aws")


def cloud_config(host_private: str, host_public: str, user_public: str, max_minutes: int) -> str:
    """User data: the pinned host key, the user's key, and the safety-net shutdown."""
    import yaml

    doc = {
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": host_private, "ed25519_public": host_public},
        "ssh_authorized_keys": [user_public],
        "runcmd": [["shutdown", "-h", f"+{max_minutes}"]],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)
