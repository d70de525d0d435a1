"""The `aws.controller:` section: where `orch launch --remote` will run a sweep's controller."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.errors import SpecError

AWS = """
    name: away
    backend: aws
    store: s3://bucket/prefix
    aws:
      image: ami-0123456789abcdef0
"""


def write(tmp_path, text: str):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_the_controller_section_has_working_defaults_and_is_no_part_of_the_recorded_sweep(tmp_path):
    sweep = load_sweep(write(tmp_path, AWS))
    c = sweep.spec.aws.controller
    assert (c.instance_type, c.image, c.image_owner, c.python, c.max_hours) == (
        "t3.micro",
        None,
        "amazon",
        "python3.11",
        48,
    )
    changed = load_sweep(write(tmp_path, AWS + "      controller: {instance_type: t4g.micro, max_hours: 5}\n"))
    assert changed.spec.aws.controller.instance_type == "t4g.micro"
    assert changed.resolved() == sweep.resolved()  # a relaunch may move the controller: the runs are the same
    assert "controller" not in sweep.resolved()["aws"]


@pytest.mark.parametrize(
    "extra, words",
    [
        ("      controller: {instance_typ: t3.micro}\n", "instance_typ"),
        ("      controller: {max_hours: 0}\n", "max_hours"),
        ("      controller: {max_hours: 100000}\n", "max_hours"),
        ("      controller: {python: ''}\n", "python"),
        ("      controller: {python: '$(id)'}\n", "python"),
        ("      controller: {instance_type: '../t3;rm'}\n", "instance_type"),
    ],
)
def test_a_bad_controller_section_is_refused_with_the_field(tmp_path, extra, words):
    with pytest.raises(SpecError) as info:
        load_sweep(write(tmp_path, AWS + extra))
    assert "aws.controller" in str(info.value) and words in str(info.value), str(info.value)


def test_the_packages_a_remote_controller_installs_are_orchs_dependencies():
    from pathlib import Path

    import tomllib

    from orchestrator.backends.aws.remote import PACKAGES

    pyproject = tomllib.loads((Path(__file__).parents[4] / "pyproject.toml").read_text())
    assert list(PACKAGES) == pyproject["project"]["dependencies"]


def test_the_controller_role_may_touch_only_its_own_sweep():
    import re

    from orchestrator.backends.aws.cloud.iam import controller_iam_name, controller_role_policy
    from orchestrator.sweep.spec import NAME_RE

    assert controller_iam_name("away") == "orch-away.controller"
    assert re.match(NAME_RE, "away.controller") is None  # no sweep's own role can be named like a controller's
    long = controller_iam_name("x" * 63)
    assert len(long) <= 64 and long.endswith(".controller") and long.startswith("orch-")
    doc = controller_role_policy("b", "pre", "away", "arn:aws:iam::1:role/orch-away")
    text = str(doc)
    assert "arn:aws:s3:::b/pre/away/*" in text and "iam:CreateRole" not in text and "iam:PutRolePolicy" not in text
    [passing] = [s for s in doc["Statement"] if s["Action"] == "iam:PassRole"]
    assert passing["Resource"] == ["arn:aws:iam::1:role/orch-away"]
    tagged = [s for s in doc["Statement"] if "ec2:TerminateInstances" in s["Action"]]
    assert tagged[0]["Condition"] == {"StringEquals": {"aws:ResourceTag/orch:sweep": "away"}}
