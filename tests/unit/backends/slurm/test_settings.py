"""The `slurm:` section as `orch launch` reads it: what is wrong is named with file:line and the fix, exit 2, no
traceback, nothing asked of Slurm (these run on a machine with no cluster)."""

from __future__ import annotations

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.backends.slurm.settings import time_seconds
from orchestrator.errors import SpecError
from tests.conftest import no_traceback


@pytest.mark.parametrize(
    ("section", "line", "says"),
    [
        ("slurm:\n  time: 90 minutes\n", 5, "`H:MM:SS`"),
        ("slurm:\n  time: '1:2:3:4'\n", 5, "not a Slurm time limit"),
        ("slurm:\n  partition: 'gpu; rm -rf ~'\n", 5, "is not a Slurm name"),
        ("slurm:\n  sbatch: [--job-name=mine]\n", 5, "orch names each job after its run"),
        ("slurm:\n  sbatch: ['-p gpu']\n", 5, "use `slurm.partition`"),
        ("slurm:\n  sbatch: [--time=10]\n", 5, "use `slurm.time`"),
        ("slurm:\n  sbatch: [constraint=a100]\n", 5, "not an sbatch option"),
        ("slurm:\n  login: 'alice@login:22:1'\n", 5, "is not `[user@]host[:port]`"),
        ("slurm:\n  login: alice@login\n  known_hosts: /nonexistent/known\n", 6, "checks the login node's key"),
        ("slurm:\n  key: /nonexistent/id\n", 5, "no such file"),
        ("slurm:\n  time: '2'\n", 5, "right after it starts"),
        ("slurm:\n  warn_s: 5\n", 5, "greater than or equal to 10"),
        ("budget_usd: 5\n", 4, "slurm.price_per_gpu_hour"),
        ("slurm:\n  partitions: gpu\n", 5, "partitions"),
    ],
)
def test_a_wrong_slurm_section_is_refused_with_where_and_the_fix(tmp_path, section, line, says):
    path = tmp_path / "sweep.yaml"
    path.write_text('name: bad\ncommand: "true"\nbackend: slurm\n' + section)
    with pytest.raises(SpecError) as refused:  # what `orch launch` loads a sweep file with (the CLI's refusal below)
        load_sweep(path)
    assert f"sweep.yaml:{line}:" in str(refused.value) and says in str(refused.value), str(refused.value)


def test_the_cli_refuses_a_wrong_slurm_section_with_exit_2_and_no_traceback(orch):
    path = orch.sweep('name: bad\ncommand: "true"\nbackend: slurm\nslurm:\n  time: 90 minutes\n')
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 2, r.out + r.err
    no_traceback(r)
    assert "sweep.yaml:5:" in r.err and "`H:MM:SS`" in r.err, r.err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400),
        ("1:30", 90),
        ("4:00:00", 14400),
        ("1-12", 129600),
        ("1-12:30", 131400),
        ("2-00:00:01", 172801),
        ("0", 0),
        ("1:2:3:4", None),
        ("1h", None),
        ("-5", None),
    ],
)
def test_slurms_time_formats(text, seconds):
    assert time_seconds(text) == seconds
