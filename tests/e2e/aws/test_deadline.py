"""`deadline:` through `orch launch` on the fake cloud: with spot refused, the runs wait on spot until the schedule
needs them and are then bought on-demand, finishing before the deadline; an easy deadline buys no on-demand; a
deadline the work cannot meet even all on-demand is refused by the dry run with the shortfall, and one in the past by
the launch, before anything is made."""

from __future__ import annotations

import json
import re
import signal

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states
from tests.e2e.aws import test_regions as regions
from tests.fakecloud import BUCKET
from tests.fakecloud.sweeps import smoke
from tests.unit.control.test_notify import Hook

pytestmark = pytest.mark.slow
clouds = regions.clouds  # a fake cloud with two regions (us-east-1, us-west-2)


@pytest.fixture
def receiver():
    """A JSON webhook receiver on loopback (what Apprise's json:// posts to)."""
    h = Hook()
    yield h
    h.close()


def _ledger(cloud, name: str) -> dict:
    key = f"sweeps/{name}/cost.json"
    return json.loads(cloud.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _launched_at(cloud, name: str) -> float:
    key = f"sweeps/{name}/sweep.json"
    return json.loads(cloud.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read())["launched_at"]


@pytest.mark.timeout(400)
def test_spot_refused_moves_runs_to_on_demand_only_when_the_schedule_needs_it_and_meets_the_deadline(
    orch, cloud, identity
):
    cloud.gate.fleet_errors[("spot", "*", "*")] = "InsufficientInstanceCapacity"  # spot never there
    path = smoke(
        orch,
        identity,
        "due",
        command="sleep 2",
        grid={"lr": [1, 2]},
        timeout_minutes=0.5,  # each run: 30 s at most, assumed until one finished
        deadline="80s",
        aws_switch_s=10,
    )
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0, dry.out + dry.err
    assert re.search(r"deadline \S+ \(\d+s from now\): 2 runs left, 0\.5 min each, assumed", dry.out), dry.out
    assert "would move to on-demand" in dry.out and "spot-then-on-demand price" in dry.out, dry.out
    # the bound is every hour on-demand; how much of it is the on-demand share the deadline may buy
    held = r"at most \$([\d.]+) if spot holds throughout"
    share = re.search(held + r" .* the on-demand share, up to \$([\d.]+) \((\d+)%", dry.out)
    bound = re.search(r"estimated cost at most \$([\d.]+)", dry.out)
    assert share and bound, dry.out
    assert float(share[1]) < float(bound[1]) and 0 < int(share[3]) < 100, dry.out
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    states = run_states(orch, "due")
    assert all(s["state"] == "succeeded" for s in states.values()), states
    at = _launched_at(cloud, "due")
    deadline = at + 80
    ledger = _ledger(cloud, "due")
    assert sorted(e["market"] for e in ledger.values()) == ["on-demand", "on-demand"], ledger
    # the latest start of each: 80 s less the 10 s margin, less 30 s of work and a 10 s switch = 30 s after the
    # launch; a pass buys up to 10 s ahead (schedule.PASS_SLACK_S): no on-demand hour before the schedule needed it
    starts = sorted(e["start"] - at for e in ledger.values())
    assert all(s >= 30 - 10 - 0.5 for s in starts), starts
    assert all(s["finished_at"] < deadline for s in states.values()), (deadline, states)
    shown = json.loads(orch("status", "due", "--json").out)["deadline"]
    assert shown["deadline"] == pytest.approx(deadline) and shown["work_left_s"] == 0
    c = orch("collect", "due", "--out", str(orch.tmp / "due-results"))
    assert c.code == 0, c.out + c.err
    assert re.search(r"deadline: met, \d+s to spare", c.out), c.out
    bought = json.loads((orch.tmp / "due-results" / "runs.json").read_text())["deadline"]
    assert bought["usd"]["spot"] == 0 and bought["usd"]["on-demand"] > 0
    assert bought["all_spot_usd"] < bought["usd"]["on-demand"] == pytest.approx(bought["all_on_demand_usd"])
    orch("down", "due")


@pytest.mark.timeout(300)
def test_an_easy_deadline_buys_no_on_demand_and_one_that_cannot_be_met_is_refused_with_the_shortfall(
    orch, cloud, identity
):
    easy = smoke(orch, identity, "easy", command="true", grid={"lr": [1]}, timeout_minutes=1, deadline="2d")
    r = orch("launch", str(easy), timeout=200)
    assert r.code == 0, r.out + r.err
    assert [e["market"] for e in _ledger(cloud, "easy").values()] == ["spot"]
    assert "on schedule" in orch("status", "easy").out
    # 4 runs of 15 min on 2 slots need 2 x (15 min + 5 min to start) = 40 min: an hour's deadline is met...
    # (another command than `easy`'s: a later sweep of the same command would start from the boot `easy` measured)
    fits = smoke(orch, identity, "fits", command=":", grid={"lr": [1, 2, 3, 4]}, timeout_minutes=15, deadline="1h")
    ok = orch("launch", str(fits), "--dry-run")
    assert ok.code == 0 and "4 runs left, 15.0 min each" in ok.out, ok.out + ok.err
    # ... 30 minutes is not: 10 min short (the dry run says by how much, at the field's line)
    hard = smoke(orch, identity, "hard", command=":", grid={"lr": [1, 2, 3, 4]}, timeout_minutes=15, deadline="30m")
    no = orch("launch", str(hard), "--dry-run")
    assert no.code == 2 and "Traceback" not in no.err, no.out + no.err
    assert re.search(r"hard\.yaml:\d+: deadline: cannot be met even with every run on on-demand", no.err), no.err
    assert "about 10m after it" in no.err, no.err
    past = smoke(
        orch, identity, "past", command="true", grid={"lr": [1]}, timeout_minutes=1, deadline="2020-01-01T00:00Z"
    )
    for how in ((), ("--remote",)):  # on this machine, and before a remote controller is bought
        late = orch("launch", str(past), *how)
        assert late.code == 2 and "in the past" in late.err and "Traceback" not in late.err, late.out + late.err
    ec2 = cloud.client("ec2")
    assert not ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": ["orch-past"]}])[
        "LaunchTemplates"
    ]  # refused before anything was made
    assert not [
        i
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] in ("pending", "running") and any(t["Value"] == "past" for t in i.get("Tags", []))
    ]
    orch("down", "easy")


@pytest.mark.timeout(400)
def test_a_run_on_spot_that_a_reclaim_would_make_late_is_moved_to_on_demand_from_its_checkpoint(orch, cloud, identity):
    """Spot is there and the deadline leaves room to start on spot; as the run goes on without reporting progress
    (its lines carry no `elapsed_s`: its work left stays the assumed 60 s) the room shrinks until a reclaim (its lost
    work and a move) would make it late: the controller tells it to checkpoint, and its next attempt is bought
    on-demand and resumes from that checkpoint — an interruption, not a failure."""
    from tests.e2e.slurm.test_slurm_backend import COUNTER

    (orch.tmp / "counter.py").write_text(COUNTER)
    # first pass (the move assumed 20 s): it needs 80 s and has 120 - 20: it waits for spot, which is there; once
    # the boot is measured (a few seconds here) a reclaim would need 60 s + 2 moves: late from ~40 s after the launch
    path = smoke(
        orch,
        identity,
        "moved",
        command="python3 counter.py 100",  # 50 s of half-second steps
        grid={"lr": [1]},
        timeout_minutes=1,
        deadline="120s",
        aws_switch_s=20,
    )
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    run = run_states(orch, "moved")["lr=1"]
    assert (run["state"], run["attempt"], run["failures"], run["preemptions"]) == ("succeeded", 2, 0, 1), run
    entries = sorted(_ledger(cloud, "moved").values(), key=lambda e: e["start"])
    assert [e["market"] for e in entries] == ["spot", "on-demand"], entries
    assert "resumed from step" in orch("logs", "moved/lr=1", "--attempt", "2").out
    orch("down", "moved")


@pytest.mark.timeout(500)
def test_a_controller_killed_mid_sweep_is_relaunched_on_the_same_schedule_and_buys_nothing_twice(orch, cloud, identity):
    """The schedule is recomputed from the store: the deadline from the first launch's `launched_at`, the run on
    on-demand adopted where it runs (its attempt goes on), the next bought on-demand once the schedule needs it."""
    from tests.e2e.slurm.test_slurm_backend import COUNTER

    (orch.tmp / "counter.py").write_text(COUNTER)
    cloud.gate.fleet_errors[("spot", "*", "*")] = "InsufficientInstanceCapacity"
    path = smoke(
        orch,
        identity,
        "again",
        command="python3 counter.py 30",  # 15 s of half-second steps
        grid={"lr": [1, 2]},
        max_parallel=1,
        timeout_minutes=0.5,
        deadline="150s",  # 2 x (30 s + 10 s a move) + 10 s of margin: spot until ~60 s after the launch
        aws_switch_s=10,
    )
    ctl = orch.popen("launch", str(path))

    def running() -> str:
        return next((r for r, s in run_states(orch, "again").items() if s.get("state") == "running"), "")

    first = retry_until(running, 300, 0.2, "a run on on-demand to run")
    ctl.send_signal(signal.SIGKILL)
    ctl.wait(10)
    at = _launched_at(cloud, "again")
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0 and "deadline moved" not in r.out, r.out + r.err
    assert _launched_at(cloud, "again") == at  # the deadline still counts from the first launch
    states = run_states(orch, "again")
    assert all(s["state"] == "succeeded" for s in states.values()), states
    assert (states[first]["attempt"], states[first]["failures"]) == (1, 0), (states, r.out[-3000:])  # adopted
    entries = list(_ledger(cloud, "again").values())
    assert sorted(e["market"] for e in entries) == ["on-demand", "on-demand"], entries  # one instance per run
    assert all(s["finished_at"] < at + 150 for s in states.values()), (at, states)
    assert orch("down", "again").code == 0 and not any(cloud.leftovers("again").values())


@pytest.mark.timeout(400)
def test_the_budget_wins_over_the_deadline_and_both_are_told(orch, cloud, identity, receiver):
    """Spot is refused and the schedule needs on-demand at once; the first run's on-demand hours spend the budget:
    the second never starts (the budget wins), collect says the deadline was not met and why, and the `budget`
    notification comes before the `deadline` one."""
    cloud.gate.fleet_errors[("spot", "*", "*")] = "InsufficientInstanceCapacity"
    path = smoke(
        orch,
        identity,
        "broke",
        command="sleep 2",
        grid={"lr": [1, 2]},
        max_parallel=1,
        timeout_minutes=0.5,
        deadline="100s",
        aws_switch_s=10,
        budget_usd=0.000001,
        notify=[{"url": receiver.url, "events": ["budget", "deadline"]}],
    )
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    states = sorted((s["state"], s.get("reason", "")) for s in run_states(orch, "broke").values())
    assert [s for s, _ in states] == ["cancelled", "succeeded"] and "budget" in states[0][1], states
    assert [e["market"] for e in _ledger(cloud, "broke").values()] == ["on-demand"]
    c = orch("collect", "broke", "--out", str(orch.tmp / "broke-results"))
    assert c.code == 0 and "deadline: not met: 1 run(s) never ran, stopped by budget_usd" in c.out, c.out + c.err
    retry_until(lambda: "orch: sweep broke: deadline not met" in receiver.titles(), 60, 0.2, "the deadline's news")
    titles = receiver.titles()
    assert titles.index("orch: sweep broke: budget reached") < titles.index("orch: sweep broke: deadline not met")
    assert titles.count("orch: sweep broke: deadline not met") == 1, titles
    orch("down", "broke")


@pytest.mark.timeout(500)
def test_a_packed_run_moved_to_on_demand_takes_no_slot_of_a_spot_instance(orch, cloud, identity):
    """Two runs share a 4-slot spot instance; a reclaim would make them late, so each is moved: its next attempt
    goes to an on-demand instance — never back to one of the free slots of the spot instance it just left (which
    made the move worth nothing)."""
    from tests.e2e.aws.test_regions_packing import attempts_on_hosts
    from tests.e2e.slurm.test_slurm_backend import COUNTER

    (orch.tmp / "counter.py").write_text(COUNTER)
    path = smoke(
        orch,
        identity,
        "packdue",
        command="python3 counter.py 200",  # 100 s of half-second steps, lines without a clock: 120 s assumed
        grid={"lr": [1, 2]},
        resources={"gpus": 1},
        aws_instance_types=["g5.12xlarge"],  # 4 GPUs: 4 slots
        timeout_minutes=2,
        # 120 s + a 20 s move + the margin fit: spot first; once the boot is measured (seconds) a reclaim of either
        # run (its lost work, two moves) would make it late from about a minute after the launch
        deadline="200s",
        aws_switch_s=20,
    )
    r = orch("launch", str(path), timeout=400)
    assert r.code == 0, r.out + r.err
    states = run_states(orch, "packdue")
    assert all(s["state"] == "succeeded" and s["failures"] == 0 for s in states.values()), states
    market = {iid: e["market"] for iid, e in _ledger(cloud, "packdue").items()}
    placed = attempts_on_hosts(cloud, "packdue")
    first = {market[iid] for (_, attempt), ids in placed.items() if attempt == 1 for iid in ids}
    assert first == {"spot"}, (placed, market)
    later = {(run, attempt): market[iid] for (run, attempt), ids in placed.items() if attempt > 1 for iid in ids}
    assert later and set(later.values()) == {"on-demand"}, (placed, market)
    orch("down", "packdue")


@pytest.mark.timeout(500)
def test_a_two_node_run_is_bought_on_demand_whole_in_the_region_that_has_capacity(orch, clouds, identity):
    """us-east-1 has no capacity at all and spot is refused everywhere: at the switch moment both nodes of the run's
    attempt are bought on-demand, together, in us-west-2, and it ends before the deadline."""
    from tests.e2e.aws.test_regions import WEST, no_capacity, with_regions
    from tests.fakecloud import REGION

    no_capacity(clouds, REGION)
    clouds.gate.fleet_errors[("spot", "*", "*")] = "InsufficientInstanceCapacity"
    extra = "max_restarts: 0\ntimeout_minutes: 0.5\ndeadline: 80s\nresources:\n  nodes: 2"
    text = clouds.sweep_yaml("wide", identity, "sleep 3", extra=extra, switch_s="10", heartbeat_s="1", sync_s="2")
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    [run] = run_states(orch, "wide").values()
    at = _launched_at(clouds, "wide")
    assert run["state"] == "succeeded" and run["finished_at"] < at + 80, (at, run)
    entries = list(_ledger(clouds, "wide").values())
    assert [(e["market"], e["region"]) for e in entries] == [("on-demand", WEST)] * 2, entries
    # the switch moment: 80 s less the 10 s margin, the 30 s run and a 10 s move; a pass buys up to 10 s ahead
    assert all(e["start"] - at >= 30 - 10 - 0.5 for e in entries), (at, entries)
    orch("down", "wide")


@pytest.mark.timeout(1200)
def test_a_remote_controller_keeps_the_deadline_and_buys_on_demand_from_its_switch_moment(orch, cloud, identity):
    """`--remote`: the controller on its own instance plans from the record the laptop's launch wrote; spot refused,
    the run is bought on-demand no earlier than its switch moment and ends before the deadline."""
    from tests.conftest import ENDED_GAP_S
    from tests.e2e.aws.test_remote_launch import CONTROLLER, controller_ids

    cloud.gate.fleet_errors[("spot", "*", "*")] = "InsufficientInstanceCapacity"  # (the controller is on-demand)
    extra = "max_restarts: 0\ntimeout_minutes: 0.5\ndeadline: 180s"  # switch moment: 180 - 10 - (30 + 10) s
    text = cloud.sweep_yaml("farout", identity, "sleep 3", extra=extra, controller=CONTROLLER, switch_s="10")
    r = orch("launch", str(orch.sweep(text)), "--remote", timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    retry_until(
        lambda: run_states(orch, "farout", gap=ENDED_GAP_S).get("run", {}).get("state") == "succeeded",
        400,
        1.0,
        "the run to finish",
    )
    at = _launched_at(cloud, "farout")
    run = run_states(orch, "farout")["run"]
    assert run["finished_at"] < at + 180, (at, run)
    entries = [e for e in _ledger(cloud, "farout").values() if not e.get("role")]
    assert [e["market"] for e in entries] == ["on-demand"], entries
    assert entries[0]["start"] - at >= 130 - 10 - 0.5, (at, entries)  # a pass buys up to 10 s ahead
    retry_until(lambda: not controller_ids(cloud, "farout"), 120, 0.5, "the controller to end its own instance")
    assert orch("down", "farout").code == 0 and not any(cloud.leftovers("farout").values())
