"""`aws:` settings that cannot work, refused before anything is bought: a private address without `ssh_cidr`, a
malformed `ssh_cidr` or instance profile name, `idle_minutes` without `keep_alive`, an instance without a profile, an
account without a default VPC."""

from __future__ import annotations

import pytest

from tests.fakecloud import FakeCloud
from tests.fakecloud.sweeps import smoke


def test_private_ip_without_ssh_cidr_is_refused_with_the_fix(orch, cloud, identity):
    text = cloud.sweep_yaml("privnet", identity, "true").replace("  ssh_cidr: 127.0.0.1/32\n", "")
    r = orch("launch", str(orch.sweep(text)), "--dry-run")
    assert r.code == 2 and "aws.ssh_cidr" in r.err and "private_ip" in r.err and "Traceback" not in r.err, r.err


@pytest.mark.parametrize(
    "cidr, words",
    [
        ("banana", "not a CIDR"),
        ("127.0.0.1", "not a CIDR"),  # EC2 wants the prefix length
        ("300.0.0.1/32", "not a CIDR"),
        ("127.0.0.1/33", "not a CIDR"),
        ("2001:db8::/64", "IPv6 is not supported"),
        ("127.0.0.1/24", "write 127.0.0.0/24 (the network) or 127.0.0.1/32"),
    ],
)
def test_a_malformed_ssh_cidr_is_refused_by_the_dry_run_with_file_line_and_the_fix(orch, cloud, identity, cidr, words):
    text = cloud.sweep_yaml("badcidr", identity, "true")
    path = orch.sweep(text.replace("  ssh_cidr: 127.0.0.1/32\n", f"  ssh_cidr: {cidr}\n"))
    line = 1 + text.splitlines().index("  ssh_cidr: 127.0.0.1/32")
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 2 and f"{path}:{line}: aws.ssh_cidr: " in r.err and words in r.err, r.err
    assert "e.g. 203.0.113.7/32" in r.err or "/32 (one address)" in r.err, r.err
    assert "Traceback" not in r.err and not cloud.all_leftovers(), r.err


@pytest.mark.parametrize(
    "lines, field, words",
    [
        ("  idle_minutes: 30\n", "aws.idle_minutes", "Add `keep_alive: true`"),
        (
            "  instance_profile: arn:aws:iam::123456789012:instance-profile/team-gpu\n",
            "aws.instance_profile",
            "write its name, `team-gpu`, not its ARN",
        ),
        ("  instance_profile: team gpu\n", "aws.instance_profile", "an existing profile's name"),
    ],
)
def test_settings_that_would_pass_silently_are_refused_by_the_dry_run(orch, cloud, identity, lines, field, words):
    # idle_minutes without keep_alive did nothing; a malformed profile name waited out CreateFleet's "Invalid IAM
    # Instance Profile name" as if the profile were new, then failed the launch
    text = cloud.sweep_yaml("quiet", identity, "true").replace(
        "  ssh_cidr: 127.0.0.1/32\n", "  ssh_cidr: 127.0.0.1/32\n" + lines
    )
    line = 1 + text.splitlines().index(lines.rstrip("\n"))
    path = orch.sweep(text)
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 2 and f"{path}:{line}: {field}: " in r.err and words in r.err and "Traceback" not in r.err, r.err


@pytest.mark.slow
def test_h_an_instance_without_a_profile_is_refused_at_validation(orch, cloud, identity):
    path = smoke(orch, identity, "noprof", aws_instance_profile=None)
    r = orch("launch", str(path))
    assert (
        r.code == 2 and "aws.instance_profile" in r.err and "terminate itself" in r.err and "Traceback" not in r.err
    ), r.err
    assert not cloud.all_leftovers()


@pytest.mark.slow
def test_no_default_vpc_is_a_clear_error(orch, tmp_path, identity):
    with FakeCloud(tmp_path / "c", default_vpc=False) as cloud:
        orch.env.update(cloud.env())
        r = orch("launch", str(smoke(orch, identity, "novpc", command="true")))
        assert r.code != 0 and "no default VPC" in r.err and "aws.subnet_ids" in r.err and "Traceback" not in r.err, (
            r.err
        )
        assert not cloud.all_leftovers()
