"""Several runs on one multi-GPU instance (packing): the plan (pure), the host's slot register under
its lock (real bash and flock), and on the fake cloud four `gpus: 1` runs on one 4-GPU instance,
each with its own CUDA_VISIBLE_DEVICES, interrupted together and resumed together, the instance
living until its last run ends; no run packed where the instance's safety-net shutdown would cut it."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.host.aws.slots import CLAIM, doom, leave
from orchestrator.sweep.packing import PackChoice, rank, visible_devices
from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET

GPUS = {"g5.xlarge": 1, "g5.12xlarge": 4, "g5.48xlarge": 8, "c5.large": 0}


def test_the_cheapest_home_for_max_parallel_runs_comes_first():
    prices = {"g5.xlarge": 1.0, "g5.12xlarge": 5.7, "g5.48xlarge": 16.3, "c5.large": 0.1}
    types = list(GPUS)
    # 4 runs of 1 GPU: 4 x g5.xlarge ($4.00) beats 1 x g5.12xlarge ($5.70) and 1 x g5.48xlarge; c5 cannot hold one
    assert rank(types, GPUS, prices, gpus=1, parallel=4) == [
        PackChoice("g5.xlarge", 1, 4, 4.0),
        PackChoice("g5.12xlarge", 4, 1, 5.7),
        PackChoice("g5.48xlarge", 8, 1, 16.3),
    ]
    # at the same price per GPU, fewer instances win
    same = {"g5.xlarge": 1.0, "g5.12xlarge": 4.0, "g5.48xlarge": 8.0}
    assert [c.instance_type for c in rank(types, GPUS, same, gpus=1, parallel=4)] == [
        "g5.12xlarge",
        "g5.xlarge",
        "g5.48xlarge",
    ]
    # 2-GPU runs: a g5.xlarge holds none; unknown prices go last
    assert [(c.instance_type, c.slots) for c in rank(types, GPUS, {"g5.48xlarge": 16.3}, gpus=2, parallel=8)] == [
        ("g5.48xlarge", 4),
        ("g5.12xlarge", 2),
    ]
    assert [visible_devices(k, 2) for k in range(3)] == ["0,1", "2,3", "4,5"]


def claim(home, slot, value) -> int:
    return subprocess.run(
        ["bash", "-c", CLAIM, "claim", str(slot), value], env={"HOME": str(home), "PATH": "/usr/bin:/bin"}
    ).returncode


def test_the_last_run_to_leave_ends_the_host_and_nothing_is_placed_on_a_doomed_one(tmp_path):
    assert claim(tmp_path, 0, "a#1") == 0 and claim(tmp_path, 1, "b#1") == 0
    assert claim(tmp_path, 1, "c#1") == 4  # taken
    assert leave(0, "a#1", home=tmp_path) is False  # b still runs here
    assert leave(0, "a#1", home=tmp_path) is False  # leaving twice changes nothing
    assert leave(1, "stale#0", home=tmp_path) is False  # another run's claim is not removed
    assert leave(1, "b#1", home=tmp_path) is True  # the last one: the host is marked terminating
    assert claim(tmp_path, 0, "d#1") == 3  # and takes no new run
    fresh = tmp_path / "other"
    assert claim(fresh, 2, "e#1") == 0
    doom(home=fresh)  # a spot notice
    assert claim(fresh, 3, "f#1") == 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_one_gpu_runs_share_one_four_gpu_instance_and_resume_together(orch, cloud, identity, tmp_path):
    # The fake hosts share this machine's files: every second attempt waits until all four have started (so they
    # overlap: a run that ended would free its GPU for the next, rightly), then k=3's waits for `release`.
    release, started = tmp_path / "release", tmp_path / "started"
    started.mkdir()
    command = (
        "echo $CUDA_VISIBLE_DEVICES > $ORCH_RUN_DIR/cvd.$ORCH_ATTEMPT; "
        f"if [ $ORCH_ATTEMPT = 1 ]; then sleep 600; else touch {started}/{{k}}; "
        f"while [ $(ls {started} | wc -l) -lt 4 ]; do sleep 0.2; done; "
        f"if [ {{k}} = 3 ]; then while [ ! -e {release} ]; do sleep 0.2; done; fi; fi"
    )
    path = orch.sweep(
        cloud.sweep_yaml(
            "pack",
            identity,
            command,
            extra="grid:\n  k: [0, 1, 2, 3]\nmax_parallel: 4\nmax_restarts: 0\nresources:\n  gpus: 1",
            instance_types="[g5.12xlarge]",
            heartbeat_s="1",
            sync_s="1",
        )
    )
    # (only the 4-GPU type: with the fake's prices, four g5.xlarge cost less than one g5.12xlarge, and packing takes the
    # cheaper)
    dry = orch("launch", str(path), "--dry-run")
    assert (
        dry.code == 0 and "packing: 4 runs of 1 GPU(s) per g5.12xlarge; max_parallel 4 -> 1 instance(s)" in dry.out
    ), dry.out + dry.err
    assert orch("launch", str(path), "--detach").code == 0
    runs = [f"k={k}" for k in range(4)]

    def visible(attempt) -> dict:
        s3 = cloud.client("s3")
        return {
            r: s3.get_object(Bucket=BUCKET, Key=f"sweeps/pack/{r}/cvd.{attempt}")["Body"].read().decode().strip()
            for r in runs
        }

    def _of(states: dict, ids) -> list:  # one `orch status` read for every run asked about
        return [states.get(r, {}) for r in ids]

    def all_synced(attempt) -> bool:
        try:
            return len(visible(attempt)) == 4
        except Exception:
            return False

    retry_until(
        lambda: all(v.get("state") == "running" for v in _of(status(orch, "pack"), runs)) and all_synced(1),
        180,
        0.5,
        "four runs running",
    )
    first = cloud.instances("pack")
    assert len(first) == 1, first  # one instance for all four
    assert sorted(visible(1).values()) == ["0", "1", "2", "3"]  # each run its own GPU
    tags = first[0]["tags"]
    assert tags["orch:slots"] == "4" and sorted(v for k, v in tags.items() if k.startswith("orch:slot:")) == sorted(
        f"{r}#1" for r in runs
    )

    cloud.spot_notice(first[0]["id"])  # the shared instance is going: every run on it checkpoints and resumes elsewhere
    retry_until(
        lambda: all(v.get("attempt") == 2 for v in _of(status(orch, "pack", gap=ENDED_GAP_S), runs)),
        180,
        0.5,
        "every run's second attempt",
    )
    retry_until(lambda: all_synced(2), 120, 0.5, "the second attempts to start")
    second = [i for i in cloud.instances("pack") if i["id"] != first[0]["id"]]
    assert len(second) == 1 and sorted(visible(2).values()) == ["0", "1", "2", "3"], (second, visible(2))

    # the instance lives while any of its runs is active, and goes after the last
    retry_until(
        lambda: all(v.get("state") == "succeeded" for v in _of(status(orch, "pack", gap=ENDED_GAP_S), runs[:3])),
        120,
        0.5,
        "k=0..2 to end",
    )
    assert status(orch, "pack")["k=3"]["state"] == "running" and [i["id"] for i in cloud.instances("pack")] == [
        second[0]["id"]
    ]
    release.touch()
    retry_until(
        lambda: all(v.get("state") == "succeeded" for v in _of(status(orch, "pack", gap=ENDED_GAP_S), runs)),
        120,
        0.5,
        "every run to end",
    )
    retry_until(lambda: not cloud.instances("pack"), 60, 0.5, "the shared instance to terminate after its last run")
    v = status(orch, "pack")
    assert all((v[r]["attempt"], v[r]["preemptions"], v[r]["failures"]) == (2, 1, 0) for r in runs), v
    res = orch("collect", "pack", "--out", str(orch.home / "results"))
    assert res.code == 0 and "GPU-h" in res.out, res.out + res.err
    assert orch("down", "pack", timeout=300).code == 0


def test_a_run_is_not_packed_where_the_safety_net_shutdown_would_cut_it():
    from orchestrator.backends.aws.pack import lives_long_enough

    def fits(max_minutes, timeout_minutes, age_minutes):
        return lives_long_enough(max_minutes, timeout_minutes, 0.0, age_minutes * 60.0)

    assert fits(240, 60, 100) and not fits(240, 60, 180)  # 60 min left: not enough for a 60-min run plus its sync
    assert fits(240, None, 100) and not fits(
        240, None, 130
    )  # without a timeout: at least half the instance's life left
