"""What Slurm prints is input: squeue's lines read field by field (a line that does not parse is left out, never
guessed at), sbatch's version checked, and a controller that does not answer asked again, not counted as a refusal."""

from __future__ import annotations

import pytest

from orchestrator.backends.slurm.commands import OLDEST, Slurm, parse_jobs, parse_version
from orchestrator.backends.slurm.script import job_name, parse_name
from orchestrator.errors import OrchError
from orchestrator.remote.runners import Result, Runner


def test_squeue_lines_are_read_and_garbage_is_left_out(caplog):
    out = (
        "4127|orch_s_run-1.a1|PENDING|Priority||0|N/A|\n"
        "4128|orch_s_run-2.a3|RUNNING|None|gpu-07|1|2026-12-06T10:00:00|\n"
        "not a job line at all\n"
        "x|y|z|\n"
        "4131_7|orch_s_run-4.a1|RUNNING|None|n1|0|2026|\n"
        "4129|orch_s_run-3.a1|RUNNING|None|n1|many|2026|\n"
        "\n"
    )
    jobs = parse_jobs(out)
    assert [(j.id, j.state, j.reason, j.nodes, j.restarts) for j in jobs] == [
        ("4127", "PENDING", "Priority", "", 0),
        ("4128", "RUNNING", "None", "gpu-07", 1),
    ]
    assert jobs[0].pending and jobs[0].live and not jobs[1].pending and jobs[1].live
    assert caplog.text.count("cannot read") == 2  # an array's task (4131_7) or x|y|z: not orch's, and not warned of


def test_job_names_round_trip_and_others_are_not_orchs():
    assert parse_name(job_name("orch_s_run.1", 12)) == ("orch_s_run.1", 12)
    assert parse_name("train.sh") is None and parse_name("orch_s_run.ax") is None


class Scripted(Runner):
    """A shell whose answers are given in order (Slurm's commands, as they would print)."""

    def __init__(self, *answers: Result):
        self.answers, self.asked = list(answers), []

    def run(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> Result:
        self.asked.append(command)
        return self.answers.pop(0)


def test_an_old_slurm_is_refused_with_its_version():
    assert parse_version("slurm 21.08.8-2") == (21, 8) and parse_version("slurm-wlm 22.05.8") == (22, 5)
    with pytest.raises(OrchError, match=r"this is Slurm 21\.08; orch needs Slurm 22\.05"):
        Slurm(Scripted(Result(0, "slurm 21.08.8-2\n", ""))).version()
    assert Slurm(Scripted(Result(0, "slurm 23.11.1\n", ""))).version() > OLDEST
    with pytest.raises(OrchError, match="not on the PATH"):
        Slurm(Scripted(Result(127, "", "bash: sbatch: command not found"))).version()


def test_a_controller_that_does_not_answer_is_asked_again_then_answers():
    down = Result(
        1, "", "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
    )
    shell = Scripted(down, down, Result(0, "4130\n", ""))
    assert Slurm(shell, retry_s=10).submit(["--time=10"], "#!/bin/bash\n") == "4130"
    assert len(shell.asked) == 3


def test_a_refusal_is_not_retried_and_reads_in_slurms_words():
    shell = Scripted(Result(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n"))
    with pytest.raises(OrchError, match="Invalid partition name specified"):
        Slurm(shell, retry_s=10).submit(["--partition=gpuz"], "#!/bin/bash\n")
    assert len(shell.asked) == 1
