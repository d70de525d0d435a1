"""docs/aws.md's table of every AWS call orch makes stays complete: the calls are derived from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[5]
SERVICES = ("ec2", "iam", "s3", "kms", "sts")
# The S3 transfer manager's calls (s3transfer): uploads above the multipart threshold in parts, downloads as a
# HEAD and (ranged) GETs.
TRANSFER = {
    "upload_file": {
        "s3:PutObject",
        "s3:CreateMultipartUpload",
        "s3:UploadPart",
        "s3:CompleteMultipartUpload",
        "s3:AbortMultipartUpload",
    },
    "download_file": {"s3:HeadObject", "s3:GetObject"},
}


def calls_in_code() -> dict:
    """{"service:Operation": [file:line, …]} of every boto3 client method (and paginator) orch calls."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    ops: dict = {}
    for service in SERVICES:
        for op in session.get_service_model(service).operation_names:
            ops.setdefault(xform_name(op), []).append(f"{service}:{op}")
    found: dict = {}
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, receiver = node.func.attr, ast.unparse(node.func.value).lower()
            if name == "get_paginator" and node.args and isinstance(node.args[0], ast.Constant):
                name = node.args[0].value
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if name in TRANSFER:
                for call in TRANSFER[name]:
                    found.setdefault(call, []).append(where)
            elif name in ops:
                named = [c for c in ops[name] if c.split(":")[0] in receiver] or ops[name]
                found.setdefault(named[0], []).append(where)
    return found


def calls_in_table() -> set:
    page = (ROOT / "docs" / "aws.md").read_text()
    table = page.split("## Every AWS call orch makes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {c for row in rows for c in re.findall(r"`([a-z0-9]+:[A-Za-z0-9]+)`", row.split(" | ")[0])}


def test_every_aws_call_orch_makes_has_a_row_in_the_call_table():
    code, table = calls_in_code(), calls_in_table()
    assert {"ec2:CreateFleet", "iam:CreateRole", "s3:PutObject", "kms:DescribeKey"} <= set(code)  # the scan works
    missing = {c: code[c][:2] for c in sorted(set(code) - table)}
    assert not missing, f"calls orch makes that docs/aws.md's call table lacks: {missing}"
    assert not table - set(code), f"rows for calls orch no longer makes: {sorted(table - set(code))}"


def test_the_retry_counts_this_page_gives_are_the_clients():
    """botocore's `max_attempts` counts retries after the first try (`total_max_attempts` counts tries): orch's EC2
    and IAM clients ask for 8 retries, 9 tries in all; the store's S3 client keeps botocore's default, standard mode's
    3 tries. The call table's preamble says so."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.store.s3 import S3Store

    ec2 = api.client("ec2", "us-east-1")
    assert ec2.meta.config.retries.get("total_max_attempts") == 9, ec2.meta.config.retries
    s3 = S3Store("s3://bucket/prefix").client
    assert s3.meta.config.retries.get("mode") == "standard" and "total_max_attempts" not in s3.meta.config.retries
    from botocore.retries.standard import DEFAULT_MAX_ATTEMPTS

    assert DEFAULT_MAX_ATTEMPTS == 3
    page = " ".join((ROOT / "docs" / "aws.md").read_text().split())
    assert "8 times after the first try (`max_attempts=8` counts retries, so 9 tries in all)" in page
    assert "the store's S3 client as botocore sets it by default (standard mode, 3 tries in all)" in page
