"""A sweep over several AWS regions (`aws.regions`, docs/guides/regions.md): its fields, its home region, and what is
refused before anything is bought — through `orch launch`, on the fake cloud where AWS must answer."""

from __future__ import annotations

import re

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET, REGION
from tests.fakecloud.cloud import DATA_BUCKETS, IMAGE_NAME

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


def test_the_dry_run_names_the_home_region_and_the_regions(orch, clouds, identity):
    # a store whose bucket is in eu-west-1 (GetBucketLocation), though the sweep runs in us-east-1 and us-west-2
    clouds.client("s3").create_bucket(
        Bucket=DATA_BUCKETS[0], CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    text = with_regions(clouds.sweep_yaml("home", identity, "true"), "[us-east-1, us-west-2]")
    path = orch.sweep(text.replace(f"s3://{BUCKET}/", f"s3://{DATA_BUCKETS[0]}/"))
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.out + r.err
    assert "regions us-east-1, us-west-2 (asked in this order); home region eu-west-1" in r.out, r.out
    one = orch.sweep(clouds.sweep_yaml("home1", identity, "true"), name="one.yaml")
    r = orch("launch", str(one), "--dry-run")
    assert r.code == 0 and f"region {REGION}; home region {REGION}" in r.out, r.out + r.err


@pytest.mark.parametrize(
    ("regions", "first"),
    [("[us-west-2, us-east-1]", " (the first region listed)"), ("[us-east-1, us-west-2]", "")],
)
def test_a_region_without_the_image_is_refused_before_anything_is_made(orch, cloud, identity, regions, first):
    # the image (a name pattern) is in us-east-1 only. Listed first, us-west-2 made us-east-1's group and template, then
    # failed on its image (exit 1, "Check `aws.region`", no line) and left them with the sweep's role; listed second,
    # a failover would send runs where they can never start
    path = orch.sweep(with_regions(cloud.sweep_yaml("noimg", identity, "true"), regions))
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        refused(r, f"{path}:{line_of(path, 'image:')}: aws.image: no image", f"in us-west-2{first}: remove us-west-2")
        assert r.code == 2 and "Nothing was launched" in r.err, (args, r.err)
    assert not cloud.instances()
    for region in ("us-east-1", "us-west-2"):
        assert not any(cloud.leftovers("noimg", region).values()), (region, cloud.leftovers("noimg", region))


@pytest.mark.parametrize("regions", ["[us-west-2, us-east-1]", "[us-east-1, us-west-2]"])
def test_a_region_offering_none_of_the_types_is_refused_before_anything_is_made(orch, cloud, identity, regions):
    # listed second, it passed the dry run and a failover there ended the controller (exit 1, runs queued); listed
    # first, the first run did
    cloud.register_image(IMAGE_NAME, region="us-west-2")
    cloud.gate.unoffered.add(("*", "us-west-2*"))
    path = orch.sweep(with_regions(cloud.sweep_yaml("notypes", identity, "true"), regions))
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        where = f"{path}:{line_of(path, 'instance_types:')}: aws.instance_types: none of g5.xlarge, g6.xlarge"
        refused(r, where, "is offered in us-west-2 (us-west-2a", "remove us-west-2 from `aws.regions`")
        assert r.code == 2 and "Nothing was launched" in r.err and "us-east-1 (" not in r.err, (args, r.err)
    assert not cloud.instances()
    for region in ("us-east-1", "us-west-2"):
        assert not any(cloud.leftovers("notypes", region).values()), (region, cloud.leftovers("notypes", region))


@pytest.mark.parametrize("regions", ["", "[us-east-1, us-west-2]"])
def test_a_recipe_built_in_no_listed_region_is_refused_with_its_line_and_the_build(orch, cloud, identity, regions):
    # it was exit 1 with "no image built from recipe" and no line, after the first region's parts were made
    text = cloud.sweep_yaml("norecipe", identity, "true")
    text = with_regions(text, regions) if regions else text  # "": `region: us-east-1`
    path = orch.sweep(re.sub(r"(?m)^  image: .*$", "  image: recipe:nosuch", text, count=1))
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        refused(
            r,
            f"{path}:{line_of(path, 'image:')}: aws.image: no image built from recipe 'nosuch' in ",
            "orch ami build ami/nosuch.yaml --region us-east-1",
        )
        assert r.code == 2 and "Nothing was launched" in r.err, (args, r.err)
    assert not cloud.instances()
    for region in ("us-east-1", "us-west-2"):
        assert not any(cloud.leftovers("norecipe", region).values()), (region, cloud.leftovers("norecipe", region))


@pytest.mark.parametrize(
    ("region", "listed", "says"),
    [
        # moto's DescribeRegions, as AWS's, lists ap-east-1 as an opt-in region this account has not enabled
        ("ap-east-1", "[us-east-1, {}]", "aws account enable-region --region-name ap-east-1"),
        ("xx-nowhere-1", "[us-east-1, {}]", "xx-nowhere-1 is not an AWS region this account has"),
        ("xx-nowhere-1", "[{}]", "xx-nowhere-1 is not an AWS region this account has"),  # a list of one is `regions:`
        ("xx-nowhere-1", "", "xx-nowhere-1 is not an AWS region this account has"),  # `region:` itself
    ],
)
def test_a_region_the_account_cannot_use_is_refused_before_anything_is_bought(
    orch, cloud, identity, region, listed, says
):
    text = cloud.sweep_yaml("optin", identity, "true")
    field = "regions" if listed else "region"
    one = text.replace(ONE_REGION, f"  region: {region}\n")
    path = orch.sweep(with_regions(text, listed.format(region)) if listed else one)
    assert f"  {field}: " in path.read_text()
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        refused(r, f"{path}:{line_of(path, field + ':')}: aws.{field}: ", says, "Nothing was launched")
    assert not cloud.instances() and not any(cloud.leftovers("optin").values())


def test_a_sweep_recorded_with_several_regions_relaunches_as_the_same_sweep(orch, cloud, identity):
    from orchestrator.backends.aws.settings import AwsSection

    several = AwsSection(image="x", regions=["us-west-2", "eu-west-1"])
    assert AwsSection.model_validate(several.model_dump()).regions == ["us-west-2", "eu-west-1"]
    assert "region" not in several.model_dump() and "regions" not in AwsSection(image="x").model_dump()
    assert re.fullmatch(r"[a-z-]+-\d", AwsSection(image="x", region="eu-west-1").regions[0])


# --- runs in several regions, on a fake cloud with two ------------------------------------------------------------

WEST = "us-west-2"


@pytest.fixture
def clouds(tmp_path, orch):
    """A fake cloud with two regions (us-east-1, us-west-2): each its loopback subnets, its own copy of the image."""
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud", regions=(REGION, WEST)) as c:
        orch.env.update(c.env())
        yield c
        leaks = c.all_leftovers()
        assert not leaks, f"left behind: {leaks}"
        assert not c.gate.denied, f"the policy `orch aws policy` prints refused: {c.gate.denied}"


def no_capacity(cloud, region: str, on: bool = True) -> None:
    """Every pool of the region answers InsufficientInstanceCapacity (or no longer does)."""
    for az in (f"{region}a", f"{region}b"):
        if on:
            cloud.gate.fleet_errors[("*", "*", az)] = "InsufficientInstanceCapacity"
        else:
            cloud.gate.fleet_errors.pop(("*", "*", az), None)


def one_live_attempt_per_run(calls, instances: list[dict], regions: list[str]) -> None:
    """No run had two live attempts: one instance per (run, attempt) across every region, and each attempt asked
    its regions one after another (each CreateFleet began once the one before was answered), in the listed order."""
    from collections import Counter

    per = Counter((i["tags"]["orch:run"], i["tags"]["orch:attempt"]) for i in instances)
    assert per and set(per.values()) == {1}, per
    for run, attempt in per:
        asked = sorted(
            (c for c in calls if (c.run, c.attempt, c.action) == (run, attempt, "CreateFleet")), key=lambda c: c.began
        )
        for before, after in zip(asked, asked[1:]):
            assert after.began >= before.answered, f"{run} #{attempt} asked {before.region} and {after.region} at once"
        order = [regions.index(c.region) for c in asked]
        assert order == sorted(order), f"{run} #{attempt} asked {[c.region for c in asked]}"


@pytest.mark.timeout(600)
def test_a_region_without_capacity_hands_every_run_to_the_next_and_down_empties_both(orch, clouds, identity, job):
    no_capacity(clouds, REGION)
    text = clouds.sweep_yaml("fail", identity, job(steps=3), extra="grid:\n  a: [1, 2]\nmax_parallel: 2")
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    r = orch("launch", str(path), timeout=500)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "fail")
    assert sorted(final) == ["a=1", "a=2"]
    assert all(v["state"] == "succeeded" and v["attempt"] == 1 for v in final.values()), final
    ran = clouds.instances("fail", states=("pending", "running", "shutting-down", "terminated"))
    assert ran and {i["region"] for i in ran} == {WEST}, ran  # asked in us-east-1 first, refused, bought in us-west-2
    for run in final:  # the launch's progress lines (no terminal) name each attempt's region
        assert re.search(rf"{run}: succeeded \(attempt 1, {WEST}\)", r.out), r.out[-3000:]
    assert clouds.gate.counts["InsufficientInstanceCapacity"] >= 2, clouds.gate.counts
    one_live_attempt_per_run(clouds.gate.calls, ran, [REGION, WEST])
    calls = clouds.gate.calls
    made = min(c.answered for c in calls if c.region == WEST and c.action == "CreateLaunchTemplate")
    assert made < min(c.began for c in calls if c.action == "CreateFleet"), "us-west-2 prepared only when asked"
    gc = orch("gc")  # each region's own, and the instance profile (IAM is global) once, not under each region
    assert gc.code == 0 and gc.out.count("instance-profile orch-fail") == 1, gc.out
    assert f"{WEST} fail:" in gc.out and "iam fail: 1 resource(s)" in gc.out, gc.out
    down = orch("down", "fail")
    assert down.code == 0, down.out + down.err
    assert f"{WEST}: removed" in down.out, down.out  # what each region held, said per region
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("fail", region).values()), region


@pytest.mark.timeout(600)
def test_when_the_first_region_fills_up_the_rest_of_the_runs_go_to_the_next(orch, clouds, identity, job):
    clouds.gate.region_capacity[REGION] = 1  # us-east-1 takes one run; the other two must not wait for it
    extra = "grid:\n  a: [1, 2, 3]\nmax_parallel: 3\nmax_restarts: 0"
    text = clouds.sweep_yaml("fills", identity, job(steps=3, release=True), extra=extra)
    assert orch("launch", str(orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))), "--detach").code == 0
    retry_until(lambda: len(clouds.instances("fills", states=("running",))) == 3, 300, 1.0, "three runs' instances")
    where = sorted(i["region"] for i in clouds.instances("fills"))
    assert where == [REGION, WEST, WEST], where  # one in the region asked first, the rest at once in the next
    assert clouds.gate.counts["InsufficientInstanceCapacity"] >= 1, clouds.gate.counts
    job.release.touch()
    retry_until(
        lambda: [v["state"] for v in status(orch, "fills", gap=ENDED_GAP_S).values()] == ["succeeded"] * 3,
        300,
        1.0,
        "the runs to succeed",
    )
    assert all(v["attempt"] == 1 for v in status(orch, "fills").values())
    assert orch("down", "fills").code == 0


@pytest.mark.timeout(900)
def test_a_run_interrupted_in_one_region_resumes_in_another_from_its_checkpoint(orch, clouds, identity, tmp_path):
    from tests.e2e.aws.test_spot import FAST_SYNC, TRAIN, instance_of, reference, weights_in_s3
    from tests.unit.trainer.test_train import same

    no_capacity(clouds, REGION)  # attempt 1 can only run in us-west-2
    text = clouds.sweep_yaml("moves", identity, TRAIN.replace("{seed}", "5"), extra="max_restarts: 0", **FAST_SYNC)
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: clouds.step_on_hosts("moves", "run") >= 60, 300, 0.2, "step 60")
    first = instance_of(clouds, "moves", "run", 1)
    assert [i["region"] for i in clouds.instances("moves") if i["id"] == first] == [WEST]
    no_capacity(clouds, REGION, on=False)  # us-east-1's capacity returns ...
    clouds.client("ec2", WEST).terminate_instances(InstanceIds=[first])  # ... as us-west-2 takes its instance back
    retry_until(
        lambda: status(orch, "moves", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        600,
        1.0,
        "the run to end",
    )
    v = status(orch, "moves")["run"]
    assert (v["state"], v["attempt"], v["preemptions"], v["failures"]) == ("succeeded", 2, 1, 0), v
    second = clouds.instances("moves", states=("pending", "running", "shutting-down", "terminated"))
    one_live_attempt_per_run(clouds.gate.calls, second, [REGION, WEST])  # both had capacity: us-west-2 not asked
    assert {i["region"] for i in second if i["tags"].get("orch:attempt") == "2"} == {REGION}, second
    got, _ = weights_in_s3(clouds, "sweeps/moves/run/")
    assert same(reference(tmp_path, 5), got)  # resumed from its checkpoint: as if never interrupted
    assert orch("down", "moves").code == 0
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("moves", region).values()), region


@pytest.mark.timeout(600)
def test_a_packed_sweep_whose_first_region_is_full_shares_an_instance_in_the_second(orch, clouds, identity):
    """Runs that share an instance (packing) ask the regions in order as single runs do. Seen without the fix: the
    packed runs asked us-east-1 only, pass after pass, and never started."""
    no_capacity(clouds, REGION)
    extra = "grid:\n  k: [0, 1]\nmax_parallel: 2\nmax_restarts: 0\nresources:\n  gpus: 1"
    text = clouds.sweep_yaml("packfail", identity, "true", extra=extra, instance_types="[g5.12xlarge]")
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and f"packing in {WEST}: 4 runs of 1 GPU(s) per g5.12xlarge" in dry.out, dry.out + dry.err
    r = orch("launch", str(path), timeout=500)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "packfail")
    assert sorted(final) == ["k=0", "k=1"]
    assert all(v["state"] == "succeeded" and v["attempt"] == 1 for v in final.values()), final
    ran = clouds.instances("packfail", states=("pending", "running", "shutting-down", "terminated"))
    assert ran and {i["region"] for i in ran} == {WEST}, ran
    assert all(i["tags"].get("orch:slots") == "4" for i in ran), ran  # shared instances, bought in us-west-2
    assert clouds.gate.counts["InsufficientInstanceCapacity"] >= 1, clouds.gate.counts
    assert orch("down", "packfail").code == 0
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("packfail", region).values()), region


def recipe_image(cloud, region: str, recipe: str = "tiny") -> tuple[str, dict]:
    """An image as `orch ami build` leaves it in `region` (tagged with its recipe, hash and base; its snapshot
    tagged orch:recipe), made by the test's own hand: (its id, its tags)."""
    image_id = cloud.register_image(f"orch-{recipe}-0123456789ab-20261203", region=region)
    tags = {"orch:recipe": recipe, "orch:recipe-sha": "5" * 64, "orch:base": cloud.images[region]}
    cloud.client("ec2", region).create_tags(
        Resources=[image_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()]
    )
    return image_id, tags


@pytest.mark.timeout(400)
def test_a_recipe_image_is_copied_into_the_failover_region_and_its_runs_launch_from_the_copy(orch, clouds, identity):
    built, tags = recipe_image(clouds, REGION)  # built in us-east-1 only
    no_capacity(clouds, REGION)  # so every run must go to us-west-2, which has no image of the recipe
    text = clouds.sweep_yaml("copied", identity, "true", image="recipe:tiny", extra="grid:\n  a: [1, 2]")
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and f"none in {WEST} yet: a launch copies {built} from {REGION} there" in dry.out, dry.out
    west = clouds.client("ec2", WEST)
    assert not west.describe_images(Owners=["self"], Filters=[{"Name": "tag:orch:recipe", "Values": ["tiny"]}])[
        "Images"
    ]  # the dry run copied nothing
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "copied")
    assert sorted(final) == ["a=1", "a=2"] and all(v["state"] == "succeeded" for v in final.values()), final
    copies = west.describe_images(Owners=["self"], Filters=[{"Name": "tag:orch:recipe", "Values": ["tiny"]}])["Images"]
    assert len(copies) == 1 and copies[0]["ImageId"] != built and copies[0]["State"] == "available", copies
    copy = copies[0]
    assert {t["Key"]: t["Value"] for t in copy["Tags"]} == tags  # tagged as the original: ami list / rm / gc see it
    snapshots = [b["Ebs"]["SnapshotId"] for b in copy["BlockDeviceMappings"] if b.get("Ebs", {}).get("SnapshotId")]
    snap_tags = {
        t["Key"]: t["Value"] for s in west.describe_snapshots(SnapshotIds=snapshots)["Snapshots"] for t in s["Tags"]
    }
    assert snapshots and snap_tags["orch:recipe"] == "tiny", snap_tags  # its snapshots too, at creation
    ran = clouds.instances("copied", states=("pending", "running", "shutting-down", "terminated"))
    assert ran and {i["region"] for i in ran} == {WEST}, ran
    used = {
        i["ImageId"]
        for res in west.describe_instances(Filters=[{"Name": "tag:orch:sweep", "Values": ["copied"]}])["Reservations"]
        for i in res["Instances"]
    }
    assert used == {copy["ImageId"]}, used  # launched from the copy, never before it was available
    assert orch("down", "copied").code == 0
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("copied", region).values()), region


@pytest.mark.timeout(600)
def test_down_of_a_file_whose_region_was_edited_since_its_launch_ends_what_the_launch_made(orch, clouds, identity, job):
    """`orch down FILE` goes by the regions the launch recorded, not the file's: edited to another region after the
    launch, it left the first region's instances running (and billing), its group and template behind."""
    path = orch.sweep(with_regions(clouds.sweep_yaml("moved", identity, job(steps=3, release=True)), f"[{WEST}]"))
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "moved").get("run", {}).get("state") == "running", 300, 1.0, "the run to start")
    path.write_text(path.read_text().replace(f"regions: [{WEST}]", f"regions: [{REGION}]"))
    down = orch("down", str(path))
    assert down.code == 0, down.out + down.err
    assert "stopped 1 run(s)" in down.out and f"{WEST}: removed" in down.out, down.out
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("moved", region).values()), (region, clouds.leftovers("moved", region))


@pytest.mark.timeout(600)
def test_a_relaunch_that_changes_the_regions_is_refused_naming_aws_regions(orch, clouds, identity):
    """The regions are the sweep's: reordered (or one added), the relaunch is refused and says which field changed
    (it said `changed: aws`)."""
    path = orch.sweep(with_regions(clouds.sweep_yaml("fixed", identity, "true"), f"[{REGION}, {WEST}]"))
    assert orch("launch", str(path), timeout=300).code == 0
    path.write_text(path.read_text().replace(f"regions: [{REGION}, {WEST}]", f"regions: [{WEST}, {REGION}]"))
    for args in (("--dry-run",), ()):
        again = orch("launch", str(path), *args)
        refused(again, "a different sweep named 'fixed'", "(changed: aws.regions)")
    assert orch("down", "fixed").code == 0
