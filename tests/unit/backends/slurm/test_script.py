"""A run's batch script: valid shell (bash -n, shellcheck), every user text quoted, and sbatch's options each one
word, the user's own last."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.backends.slurm.script import batch_script, node_dirs, node_script, options
from orchestrator.backends.slurm.settings import SlurmSection
from orchestrator.contract import RunTask


def _task(**kw) -> RunTask:
    base = dict(sweep="s", run_id="r'1 $(x)", attempt=2, command="true", store_url="/store", run_dir="/w/s/r/run",
                ctl_dir="/w/s/r 1/ctl", session="orch_s_r'1 $(x)")  # fmt: skip
    return RunTask(**{**base, **kw})


def _shellcheck(path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    r = subprocess.run([shellcheck, "-S", "warning", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_job_scripts_are_valid_shell_and_quote_what_they_are_given(tmp_path):
    task = _task()
    agents = [f"python3 -m orchestrator.host.agent {node_dirs(task, k)[1]!r}/task-2.json" for k in range(2)]
    node = tmp_path / "node.sh"
    node.write_text(node_script(task, agents))
    _shellcheck(node)
    text = node.read_text()  # the run's name only inside single quotes: as the session's name, and as its target
    assert text.count("$(x)") == 2 == text.count("orch_s_r'\"'\"'1 $(x)'"), text
    for nodes in (1, 2):
        batch = tmp_path / f"batch{nodes}.sh"
        batch.write_text(batch_script(task, "/w/s/r 1/ctl/node-2.sh", nodes))
        _shellcheck(batch)
    assert "srun --ntasks=2 --ntasks-per-node=1" in batch.read_text()
    assert node_dirs(task, 1) == ("/w/s/r 1/node1/run", "/w/s/r 1/node1/ctl") and node_dirs(task, 0)[1] == task.ctl_dir


def test_options_are_orchs_then_the_sections_then_the_users():
    s = SlurmSection.model_validate(
        {"partition": "gpu", "account": "lab", "qos": "hi", "time": "4:00:00", "sbatch": ["--mem=32G", "--comment=a b"]}
    )
    opts = options(s, "orch_s_r.a1", 2, "/w/ctl/slurm-%j.out")
    assert opts[:2] == ["--job-name=orch_s_r.a1", "--output=/w/ctl/slurm-%j.out"]
    assert "--requeue" in opts and "--signal=B:USR1@180" in opts and "--gres=gpu:2" in opts
    assert opts[-2:] == ["--mem=32G", "--comment=a b"]  # one word each: sbatch gets them as written
    assert [o for o in opts if o.split("=")[0] in ("--partition", "--account", "--qos", "--time")] == [
        "--partition=gpu",
        "--account=lab",
        "--qos=hi",
        "--time=4:00:00",
    ]
