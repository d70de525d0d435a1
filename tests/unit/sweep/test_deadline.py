"""`deadline:` as written: both forms, YAML's own timestamps, and every refusal at its file:line with the fix."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.errors import SpecError
from orchestrator.sweep import deadline as d

AWS = """
name: due
backend: aws
timeout_minutes: 30
store: s3://bucket/due
aws: {region: us-east-1, instance_types: [g5.xlarge], image: ami-12345678}
"""


def _load(tmp_path, text: str):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text))
    return load_sweep(p)


@pytest.mark.parametrize(
    "text, after, at",
    [
        ("90m", 5400, None),
        ("36h", 129600, None),
        ("2d", 172800, None),
        ("1h30m", 5400, None),
        ("2026-12-11T18:00Z", None, 1797012000),
        ("2026-12-11t18:00z", None, 1797012000),  # (Python 3.10's fromisoformat reads neither Z itself)
        ("2026-12-11T19:00+01:00", None, 1797012000),
    ],
)
def test_both_forms_parse(text, after, at):
    got = d.parse(text)
    assert (got.after_s, got.at) == (after, at)
    assert got.moment(1000.0) == (at if at is not None else 1000.0 + after)


def test_yamls_own_timestamp_is_read_and_a_time_without_a_zone_refused(tmp_path):
    sweep = _load(tmp_path, AWS + "deadline: 2026-12-11T18:00:00Z\n")  # YAML makes this a datetime
    assert d.parse(sweep.spec.deadline).at == 1797012000
    with pytest.raises(SpecError) as e:
        _load(tmp_path, AWS + "deadline: 2026-12-11T18:00\n")
    assert "s.yaml:7: deadline:" in str(e.value) and "no zone" in str(e.value) and "2026-12-11T18:00Z" in str(e.value)


@pytest.mark.parametrize(
    "value, words",
    [
        ("0h", "no time at all"),
        ("-5m", "neither"),
        ("soon", "neither"),
        ("[1]", "a deadline is"),
        ("10000000d", "more than 10 years"),  # it crashed the launch (no clock shows a time past year 9999)
        ("'9999-12-31T00:00Z'", "more than 10 years away"),
    ],
)
def test_a_value_that_is_no_deadline_is_refused_at_its_line(tmp_path, value, words):
    with pytest.raises(SpecError) as e:
        _load(tmp_path, AWS + f"deadline: {value}\n")
    assert "s.yaml:7: deadline:" in str(e.value) and words in str(e.value), str(e.value)


def test_a_deadline_needs_a_backend_that_buys_and_a_timeout(tmp_path):
    with pytest.raises(SpecError) as e:
        _load(tmp_path, "name: loc\ntimeout_minutes: 5\ndeadline: 36h\n")
    assert "s.yaml:3: deadline:" in str(e.value) and "backend local buys no machines" in str(e.value)
    with pytest.raises(SpecError) as e:
        _load(tmp_path, AWS.replace("timeout_minutes: 30\n", "") + "deadline: 36h\n")
    assert "needs `timeout_minutes:`" in str(e.value), str(e.value)


def test_moving_the_deadline_is_no_different_sweep(tmp_path):
    from orchestrator.sweep.record import FREE

    assert "deadline" in FREE
