"""A real Slurm cluster per test (tests/slurmcluster.py), and the orch CLI pointed at it."""

from __future__ import annotations

import sys

import pytest

from tests.slurmcluster import SlurmCluster, available


@pytest.fixture
def cluster(tmp_path, orch):
    if not available():
        pytest.fail("Slurm is not installed: scripts/test.sh installs slurm-wlm and munge (apt-get)")
    with SlurmCluster(tmp_path / "cluster") as c:
        orch.env["SLURM_CONF"] = str(c.conf)
        orch.env["HOME"] = str(tmp_path / "home")
        yield c


@pytest.fixture
def slurm_section(tmp_path):
    def section(**fields) -> str:
        fields = {"workdir": tmp_path / "runs", "python": sys.executable, **fields}
        lines = [f"  {k}: {v}" for k, v in fields.items()]
        return "backend: slurm\nslurm:\n" + "\n".join(lines) + "\n"

    return section
