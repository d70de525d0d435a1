"""What a mutation audit found no test checking (issue: Trust, item 14): each guarantee here fails if the
code behind it is loosened the way the audit loosened it."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from orchestrator.backends.base import Host
from orchestrator.control.controller import START, WAIT, decide
from orchestrator.store.s3 import S3Store
from orchestrator.store.status import RunStatus

NOW = 1_000_000.0


def test_a_corrupt_record_is_never_taken_as_final():
    """With a host, its agent writes it over; without one, the run gets a new attempt (test_unreadable_records)."""
    corrupt = RunStatus(run_id="r", state="corrupt", reason="not JSON")
    assert decide(corrupt, None, max_restarts=5, now=NOW, stale_s=60, start_timeout_s=60) == START
    assert decide(corrupt, Host("r", "h", "a"), max_restarts=5, now=NOW, stale_s=60, start_timeout_s=60) == WAIT


@pytest.mark.parametrize("field", ["max_parallel", "max_restarts", "max_runs", "seeds"])
def test_counts_are_whole_numbers_not_strings_or_booleans(orch, field):
    for value in ("'2'", "true", "2.5"):
        path = orch.sweep(f"name: strict\ncommand: 'true'\n{field}: {value}\n")
        r = orch("launch", str(path), "--dry-run")
        assert r.code == 2 and field in r.err and "Traceback" not in r.err, (value, r.err)


def _s3():
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


def test_a_403_on_a_key_that_exists_is_an_error_not_missing():
    client, stub = _s3()
    denied = {"Bucket": "b", "Key": "p/sweep/.orch/r/status.json"}
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403, expected_params=denied)
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "p/sweep/.orch/r/status.json"}], "KeyCount": 1},
        {"Bucket": "b", "Prefix": "p/sweep/.orch/r/status.json", "MaxKeys": 1},
    )
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403, expected_params=denied)
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "p/sweep/.orch/r/status.json"}], "KeyCount": 1},
        {"Bucket": "b", "Prefix": "p/sweep/.orch/r/status.json", "MaxKeys": 1},
    )
    with stub, pytest.raises(ClientError, match="AccessDenied"):
        S3Store("s3://b/p", client=client).get_bytes("sweep/.orch/r/status.json")
    stub.assert_no_pending_responses()
    # the same 403 for a key the listing does not show: S3's answer to a caller without ListBucket, i.e. missing
    client, stub = _s3()
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403, expected_params=denied)
    stub.add_response(
        "list_objects_v2", {"KeyCount": 0}, {"Bucket": "b", "Prefix": "p/sweep/.orch/r/status.json", "MaxKeys": 1}
    )
    with stub:
        assert S3Store("s3://b/p", client=client).get_bytes("sweep/.orch/r/status.json") is None


def test_boto3_is_pinned_where_conditional_puts_exist():
    """PutObject's IfMatch (orch's conditional status writes) first appears in botocore 1.35.69; an older
    install raises ParamValidationError, uncaught, on the first claim."""
    import re

    import botocore.session

    from tests.conftest import ROOT

    pinned = re.search(r'"boto3>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert tuple(int(x) for x in pinned.split(".")) >= (1, 35, 69)
    model = botocore.session.get_session().get_service_model("s3").operation_model("PutObject").input_shape
    assert "IfMatch" in model.members and "IfNoneMatch" in model.members
