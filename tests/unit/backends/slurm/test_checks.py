"""With a login node, a folder store must be the cluster's too: orch writes a file into it here and reads it through
the login node's shell; a login node that does not see the same file refuses the store with the fix."""

from __future__ import annotations

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.backends.slurm.checks import Cluster, _store_seen
from orchestrator.backends.slurm.commands import Slurm
from orchestrator.backends.slurm.settings import SlurmSection
from orchestrator.errors import OrchError
from orchestrator.remote.runners import LocalRunner, Result, Runner


class Elsewhere(Runner):
    """A login node with a filesystem of its own: the file is not there."""

    def run(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> Result:
        return Result(1, "", "cat: No such file or directory")


def _cluster(tmp_path, shell: Runner) -> Cluster:
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f'name: s\ncommand: "true"\nstore: {tmp_path / "store"}\nbackend: slurm\n'
        f"slurm:\n  login: me@login.cluster\n  known_hosts: {known}\n"
    )
    sweep = load_sweep(path)
    return Cluster(sweep, sweep.spec.section_as("slurm", SlurmSection), Slurm(shell), shell, 0, "/home/me/orch/slurm")


def test_a_store_the_login_node_does_not_see_is_refused_with_the_fix(tmp_path):
    with pytest.raises(OrchError, match="the login node me@login.cluster does not see") as caught:
        _store_seen(_cluster(tmp_path, Elsewhere()))
    assert "s3://" in str(caught.value) and caught.value.exit_code == 2
    assert not list((tmp_path / "store").glob(".orch-probe-*"))  # the probe file does not stay


def test_a_store_the_login_node_sees_passes(tmp_path):
    _store_seen(_cluster(tmp_path, LocalRunner()))  # the same machine: the same file
    assert not list((tmp_path / "store").glob(".orch-probe-*"))
