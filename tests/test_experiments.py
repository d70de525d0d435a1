"""Every file in experiments/ is a valid sweep, and the ones that need no cloud dry-run through the CLI."""

from __future__ import annotations

import pytest

from orchestrator.spec import load_sweep
from tests.conftest import ROOT

EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_experiment_loads(path):
    sweep = load_sweep(path)
    assert sweep.runs and sweep.spec.name == path.stem


@pytest.mark.parametrize("path", [p for p in EXPERIMENTS if load_sweep(p).spec.backend == "local"], ids=lambda p: p.name)
def test_local_experiments_dry_run(orch, path):
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0 and "nothing launched" in r.out and "Traceback" not in r.err, r.out + r.err
    assert not (orch.home / "store").exists()  # a dry run creates nothing
