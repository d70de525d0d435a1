"""The small rules every reader shares, written once: what a metric's number is, which way a metric
improves, and how an s3:// location splits."""

from __future__ import annotations

import pytest

from orchestrator.contract import default_mode, finite, keep_best
from orchestrator.store.s3url import is_s3, parse_s3, valid_bucket


@pytest.mark.parametrize("value", [True, False, float("nan"), float("inf"), float("-inf"), "0.9", None, [1]])
def test_finite_takes_no_flag_nan_infinity_or_text(value):
    assert finite(value) is None


def test_finite_gives_ints_and_floats_as_floats():
    assert finite(3) == 3.0 and isinstance(finite(3), float) and finite(-0.5) == -0.5


def test_accuracies_go_up_losses_down_other_metrics_have_no_default():
    assert (default_mode("test_acc"), default_mode("train_loss"), default_mode("lr")) == ("max", "min", None)
    best: dict = {}
    for line in ({"acc": 0.5, "loss": 2.0, "lr": 0.1}, {"acc": 0.7, "loss": 2.5, "lr": 0.3}, {"acc": 0.6, "loss": 1.0}):
        for k, v in line.items():
            keep_best(best, k, v)
    assert best == {"acc": 0.7, "loss": 1.0}


def test_an_s3_url_splits_into_bucket_and_a_prefix_without_slashes():
    assert parse_s3("s3://b-1/a/b/") == parse_s3("s3://b-1/a/b")
    where = parse_s3("s3://b-1/a/b/")
    assert (where.bucket, where.prefix, where.folder) == ("b-1", "a/b", "a/b/")
    assert parse_s3("s3://b-1").prefix == "" and parse_s3("s3://b-1/").folder == ""
    assert is_s3("s3://x") and not is_s3("/tmp/s3://x")
    with pytest.raises(ValueError):
        parse_s3("/tmp/store")
    assert valid_bucket("my.bucket-1") and not valid_bucket("My_Bucket")
