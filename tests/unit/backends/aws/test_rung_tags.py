"""A `prune:` run's instance on AWS says by its tags which rungs its record has reported (contract.RUNGS_TAG): what
the provisioner tags, and the mark the controller's listing makes of what is left (a pass reads the record when the
mark changes). The agent's removal of a tag is tested end to end on the fake cloud
(tests/unit/control/test_target.py)."""

from __future__ import annotations

from orchestrator.backends.aws.cloud.ec2 import rungs_left
from orchestrator.backends.aws.listing import hosts
from orchestrator.backends.aws.provision import Provisioner
from orchestrator.backends.aws.state import ProvisioningState
from orchestrator.backends.registry import load_sweep
from orchestrator.contract import RUNG_TAGS
from orchestrator.sweep.tasks import new_task


def state_of(tmp_path, aws: str = "aws:\n  image: ami-12345678\n", extra: str = "") -> ProvisioningState:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nbackend: aws\ncommand: 'true'\ngrid:\n  q: [1, 2, 3]\nstore: s3://bucket/sweeps\n"
        + aws
        + "prune:\n  metric: acc\n  rungs: [1, 2.5, 1234567, 1234568]\n"
        + extra
    )
    return ProvisioningState(load_sweep(path), ec2=None, ledger=None)


def tags_for(state: ProvisioningState):
    task = new_task(state.sweep, "q=1", 1, "true", "{}", "~/orch")
    tags: list = []
    task = Provisioner(state)._with_rung_tags(task, tags)
    keys = [t["Key"] for t in tags]
    assert len(keys) == len(set(keys)), keys  # CreateFleet refuses a key given twice
    return task, {t["Key"]: t["Value"] for t in tags}


def test_a_prune_runs_own_instance_gets_a_tag_per_rung_and_shared_or_kept_ones_none(tmp_path):
    task, tags = tags_for(state_of(tmp_path))
    # 1234567 and 1234568 read alike in six digits (as the agent's values at rungs are keyed): one tag, not a
    # duplicate key that CreateFleet would refuse
    assert tags == {"orch:rungs": "3", "orch:rung:1": "", "orch:rung:2.5": "", "orch:rung:1.23457e+06": ""}
    assert task.uses(RUNG_TAGS)
    for state in (
        state_of(tmp_path, extra="resources:\n  nodes: 2\n"),
        state_of(tmp_path, aws="aws:\n  image: ami-12345678\n  keep_alive: true\n"),
    ):
        task, tags = tags_for(state)
        assert not tags and not task.uses(RUNG_TAGS), state.sweep.spec


def test_the_listing_marks_a_host_by_the_rungs_its_tags_have_left(tmp_path):
    state = state_of(tmp_path)

    def mark(tags):
        inst = {
            "instance_id": "i-1",
            "run": "q=1",
            "attempt": "1",
            "slot_count": 0,
            "slots": {},
            "private_ip": "10.0.0.1",
            "public_ip": "",
            "launch_time": None,
            "rungs_left": rungs_left(tags),
        }
        (host,) = hosts(state, [inst], {}, {}, 60.0)
        return host.mark

    full = {"orch:sweep": "s", "orch:rungs": "2", "orch:rung:1": "", "orch:rung:2.5": ""}
    marks = [
        mark(full),
        mark({k: v for k, v in full.items() if k != "orch:rung:1"}),
        mark({"orch:sweep": "s", "orch:rungs": "2"}),
    ]
    assert len(set(marks)) == 3 and None not in marks, marks  # each removal changes it: the next pass reads
    assert mark({"orch:sweep": "s", "orch:rung:1": ""}) is None  # an instance that does not say: read every pass
