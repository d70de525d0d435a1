"""The safety-net shutdown of orch's user data, run as cloud-init runs it: its per-boot script at each boot,
with a stand-in `shutdown` on PATH that records what it was asked (never a real one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from orchestrator.backends.aws.cloud.userdata import SAFETY_NET, SAFETY_NET_OWNER, cloud_config


class Instance:
    """One instance's disk as the script sees it: cloud-init's data folder, the owner file, the script."""

    def __init__(self, root: Path, instance_id: str):
        self.root, self.bin = root, root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.bin / "shutdown").write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/../shutdowns"\n')
        (self.bin / "shutdown").chmod(0o755)
        self.boot_as(instance_id)

    def boot_as(self, instance_id: str) -> None:
        (self.root / "cloud").mkdir(exist_ok=True)
        (self.root / "cloud" / "instance-id").write_text(instance_id + "\n")

    def write_files(self, user_data: str) -> None:
        """cloud-init's write_files (once per instance), into this sandbox."""
        for f in yaml.safe_load(user_data.split("\n", 1)[1])["write_files"]:
            path = self.path(f["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f["content"])
            path.chmod(int(f["permissions"], 8))

    def path(self, absolute: str) -> Path:
        return self.root / "disk" / absolute.lstrip("/")

    def boot(self) -> list:
        """The per-boot folder runs (its scripts, if any); what `shutdown` was asked, all boots so far."""
        script = self.path(SAFETY_NET)
        if script.exists():  # its absolute paths, into this sandbox; $0 is the script, as cloud-init runs it
            text = script.read_text().replace(SAFETY_NET_OWNER, str(self.path(SAFETY_NET_OWNER)))
            text = text.replace("cloud_data=/var/lib/cloud/data", f"cloud_data={self.root / 'cloud'}")
            env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}"}
            subprocess.run(["sh", "-c", text, str(script)], env=env, check=True)
        log = self.root / "shutdowns"
        return log.read_text().split("\n")[:-1] if log.exists() else []


def test_the_safety_net_survives_a_reboot_and_leaves_instances_of_an_image_alone(tmp_path):
    launched = time.time() - 10 * 60  # the instance booted 10 minutes ago (user data made then)
    host = Instance(tmp_path / "builder", "i-builder")
    host.write_files(cloud_config("PRIV", "PUB", "USER", max_minutes=60, now=launched))
    first = host.boot()
    assert first in (["-h +49"], ["-h +50"])  # the deadline is absolute: an hour after the user data was made
    # CreateImage reboots the instance (runcmd would not run again): the net is scheduled again, not extended
    again = host.boot()
    assert len(again) == 2 and again[1] in ("-h +49", "-h +50")

    # its disk becomes an image; an instance launched from it by something else is left alone (and cleaned)
    other = Instance(tmp_path / "elsewhere", "i-other")
    shutil.copytree(host.root / "disk", other.root / "disk")
    assert other.boot() == []
    assert not other.path(SAFETY_NET).exists()

    # one launched by orch gets orch's user data again: a deadline of its own
    host.boot_as("i-next")
    host.write_files(cloud_config("PRIV", "PUB", "USER", max_minutes=30))
    assert host.boot()[-1] in ("-h +29", "-h +30")


def test_a_deadline_already_past_powers_off_within_a_minute(tmp_path):
    host = Instance(tmp_path / "late", "i-late")
    host.write_files(cloud_config("PRIV", "PUB", "USER", max_minutes=5, now=time.time() - 3600))
    assert host.boot() == ["-h +1"]
