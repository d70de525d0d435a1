"""A sweep over several AWS regions (`aws.regions`, docs/guides/regions.md): its fields, its home region, and what is
refused before anything is bought — through `orch launch`, on the fake cloud where AWS must answer."""

from __future__ import annotations

import re

import pytest

from tests.fakecloud import BUCKET, REGION
from tests.fakecloud.cloud import DATA_BUCKETS

pytestmark = pytest.mark.slow

ONE_REGION = f"  region: {REGION}\n"


def with_regions(text: str, regions: str) -> str:
    """A fake-cloud sweep whose `region:` line says `regions:` instead."""
    assert ONE_REGION in text
    return text.replace(ONE_REGION, f"  regions: {regions}\n")


def refused(r, *words: str) -> None:
    assert r.code != 0, r.out + r.err
    assert "Traceback" not in r.err, r.err
    for w in words:
        assert w in r.err, r.err


def line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_both_region_and_regions_are_refused_with_the_line_and_the_fix(orch, cloud, identity):
    text = cloud.sweep_yaml("both", identity, "true").replace(ONE_REGION, ONE_REGION + "  regions: [us-west-2]\n")
    path = orch.sweep(text)
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        refused(r, f"{path}:{line_of(path, 'regions:')}: aws.regions:", "keep one", "regions: [us-east-1, us-west-2]")
    assert not cloud.instances()


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("image", "ami-0123456789abcdef0", "each region has its own ids"),
        ("subnet_ids", "[subnet-0123456789abcdef0]", "subnets belong to one region"),
        ("security_group", "sg-0123456789abcdef0", "a security group belongs to one region"),
    ],
)
def test_what_belongs_to_one_region_is_refused_with_several(orch, cloud, identity, field, value, says):
    text = with_regions(cloud.sweep_yaml("onereg", identity, "true", **{field: value}), "[us-east-1, us-west-2]")
    path = orch.sweep(text)
    r = orch("launch", str(path), "--dry-run")
    refused(r, f"{path}:{line_of(path, field + ':')}: aws.{field}:", says)
    refused(orch("launch", str(path)), says)
    assert not cloud.instances()


def test_a_region_list_that_is_empty_or_repeats_a_region_is_refused(orch, cloud, identity):
    for regions, says in (("[]", "at least 1 item"), ("[us-east-1, us-west-2, us-east-1]", "listed twice")):
        path = orch.sweep(with_regions(cloud.sweep_yaml("rep", identity, "true"), regions))
        refused(orch("launch", str(path), "--dry-run"), f"{path}:{line_of(path, 'regions:')}: aws.regions", says)


def test_the_dry_run_names_the_home_region_and_the_regions(orch, cloud, identity):
    # a store whose bucket is in eu-west-1 (GetBucketLocation), though the sweep runs in us-east-1 and us-west-2
    cloud.client("s3").create_bucket(
        Bucket=DATA_BUCKETS[0], CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    text = with_regions(cloud.sweep_yaml("home", identity, "true"), "[us-east-1, us-west-2]")
    path = orch.sweep(text.replace(f"s3://{BUCKET}/", f"s3://{DATA_BUCKETS[0]}/"))
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.out + r.err
    assert "regions us-east-1, us-west-2 (asked in this order); home region eu-west-1" in r.out, r.out
    one = orch.sweep(cloud.sweep_yaml("home1", identity, "true"), name="one.yaml")
    r = orch("launch", str(one), "--dry-run")
    assert r.code == 0 and f"region {REGION}; home region {REGION}" in r.out, r.out + r.err


@pytest.mark.parametrize(
    ("region", "says"),
    [
        # moto's DescribeRegions, as AWS's, lists ap-east-1 as an opt-in region this account has not enabled
        ("ap-east-1", "aws account enable-region --region-name ap-east-1"),
        ("xx-nowhere-1", "xx-nowhere-1 is not an AWS region this account has"),
    ],
)
def test_a_region_the_account_cannot_use_is_refused_before_anything_is_bought(orch, cloud, identity, region, says):
    path = orch.sweep(with_regions(cloud.sweep_yaml("optin", identity, "true"), f"[us-east-1, {region}]"))
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        refused(r, f"{path}:{line_of(path, 'regions:')}: aws.regions: ", says, "Nothing was launched")
    assert not cloud.instances() and not any(cloud.leftovers("optin").values())


def test_a_sweep_recorded_with_several_regions_relaunches_as_the_same_sweep(orch, cloud, identity):
    from orchestrator.backends.aws.settings import AwsSection

    several = AwsSection(image="x", regions=["us-west-2", "eu-west-1"])
    assert AwsSection.model_validate(several.model_dump()).regions == ["us-west-2", "eu-west-1"]
    assert "region" not in several.model_dump() and "regions" not in AwsSection(image="x").model_dump()
    assert re.fullmatch(r"[a-z-]+-\d", AwsSection(image="x", region="eu-west-1").regions[0])
