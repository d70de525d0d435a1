"""sweep.yaml validation and expansion, through load_sweep and through the real CLI: wrong values name their field,
absurd shapes and huge sweeps are refused, only plain placeholders, misspellings get their section's hint."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap

import pytest

from orchestrator.backends.registry import load_sweep
from orchestrator.errors import SpecError
from orchestrator.sweep.expand import expand
from tests.conftest import no_traceback


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_grid_times_seeds_gives_stable_readable_ids(tmp_path):
    p = write(
        tmp_path,
        """
        name: demo
        command: "train --lr {lr} --bs {bs} --seed {seed} --tag {tag}"
        params: {tag: "a b"}
        grid:
          lr: [0.1, 0.01]
          bs: [128]
        seeds: [3, 7]
    """,
    )
    sweep = load_sweep(p)
    ids = [r.run_id for r in sweep.runs]
    assert ids == ["lr=0.1,bs=128,seed=3", "lr=0.1,bs=128,seed=7", "lr=0.01,bs=128,seed=3", "lr=0.01,bs=128,seed=7"]
    assert [r.run_id for r in load_sweep(p).runs] == ids  # stable across loads
    first = sweep.runs[0]
    assert first.command == "train --lr 0.1 --bs 128 --seed 3 --tag 'a b'"
    assert first.params == {"tag": "a b", "lr": 0.1, "bs": 128, "seed": 3}
    from orchestrator.sweep.spec import orch_home

    assert sweep.store_url == str(orch_home() / "store")  # no `store:`: $ORCH_HOME/store


def test_defaults_single_run(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: one\n"))
    assert [r.run_id for r in sweep.runs] == ["run"]
    assert "-m trainer" in sweep.runs[0].command
    assert sweep.spec.max_parallel == 2 and sweep.spec.max_restarts == 1


def test_store_relative_to_sweep_file(tmp_path):
    (tmp_path / "sub").mkdir()
    sweep = load_sweep(write(tmp_path, "name: x\nstore: ../out\n", name="sub/s.yaml"))
    assert sweep.store_url == str((tmp_path / "out").resolve())


def test_seed_count(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: x\nseeds: 3\ncommand: echo {seed}\n"))
    assert [r.run_id for r in sweep.runs] == ["seed=0", "seed=1", "seed=2"]
    assert [r.command for r in sweep.runs] == ["echo 0", "echo 1", "echo 2"]


def test_literal_braces(tmp_path):
    sweep = load_sweep(write(tmp_path, 'name: x\ncommand: "echo {{x}} {run_id}"\n'))
    assert sweep.runs[0].command == "echo {x} run"


# Each case: YAML text, the line the error must name, a fragment naming the field.
BAD = {
    "invalid_yaml": ("name: x\ngrid: [1, 2\n", 3, "invalid YAML"),
    "unknown_field": ("name: x\nmax_paralel: 2\n", 2, "max_paralel"),
    "wrong_type": ("name: x\nmax_parallel: many\n", 2, "max_parallel"),
    "empty_grid_axis": ("name: x\ncommand: echo {lr}\ngrid:\n  lr: []\n", 4, "grid.lr"),
    "empty_grid": ("name: x\ngrid: {}\n", 2, "grid"),
    "grid_clashes_params": ("name: x\ncommand: echo {lr}\nparams:\n  lr: 1\ngrid:\n  lr: [1, 2]\n", 6, "grid.lr"),
    "duplicate_run_ids": ("name: x\ncommand: echo {t}\ngrid:\n  t: ['a b', 'a_b']\n", 3, "grid"),
    "negative_max_parallel": ("name: x\nmax_parallel: -1\n", 2, "max_parallel"),
    "unknown_backend": ("name: x\nbackend: gcp\n", 2, "backend"),
    "placeholder_without_param": ("name: x\ncommand: train --lr {lr}\n", 2, "command"),
    "missing_name": ("command: echo hi\n", 1, "name"),
    "bad_name": ("name: 'my sweep!'\n", 1, "name"),
    "duplicate_yaml_key": ("name: x\nseeds: 2\nseeds: 3\n", 3, "duplicate key"),
    "not_a_mapping": ("- name: x\n", 1, "mapping"),
    "empty_file": ("", 1, "mapping"),
    "reserved_seed_in_grid": ("name: x\ngrid:\n  seed: [1, 2]\n", 3, "grid.seed"),
    "zero_seeds": ("name: x\nseeds: 0\n", 2, "seeds"),
    "repeated_grid_value": ("name: x\ncommand: echo {a}\ngrid:\n  a: [1, 1]\n", 4, "grid.a"),
    "negative_timeout": ("name: x\ntimeout_minutes: -5\n", 2, "timeout_minutes"),
    "unknown_local_field": ("name: x\nlocal:\n  slots: 4\n", 3, "local.slots"),
    "nested_grid_value": ("name: x\ngrid:\n  a: [{b: 1}]\n", 3, "grid.a"),
    "positional_placeholder": ("name: x\ncommand: echo {}\n", 2, "command"),
    "aws_backend_without_section": ("name: x\nbackend: aws\n", 2, "backend"),
    "aws_backend_local_store": ("name: x\nbackend: aws\nstore: out\naws:\n  image: ami-1\n", 3, "store"),
    "budget_on_local": ("name: x\nbudget_usd: 5\n", 2, "budget_usd"),
    "bad_s3_url": ("name: x\nstore: s3://Bad_Bucket\n", 2, "store"),
    "zero_nodes": ("name: x\nresources:\n  nodes: 0\n", 3, "resources.nodes"),
    "zero_procs": (
        "name: x\ncommand: '{torchrun} -m trainer'\nresources:\n  procs_per_node: 0\n",
        4,
        "resources.procs_per_node",
    ),
    "more_gpus_than_any_type": (
        "name: x\nbackend: aws\nstore: s3://bucket-1/p\nresources:\n  gpus: 16\naws:\n  image: ami-1\n"
        "  instance_types: [g5.xlarge, p4d.24xlarge]\n",
        5,
        "resources.gpus",
    ),
    "quoted_target_value": ("name: x\ntarget:\n  metric: test_acc\n  value: '0.9'\n", 4, "target.value"),
    "quoted_rung": ("name: x\nseeds: 3\nprune:\n  metric: test_acc\n  rungs: ['2']\n", 5, "prune.rungs[0]"),
    "negative_rung": ("name: x\nseeds: 3\nprune:\n  metric: test_acc\n  rungs: [-1, 2]\n", 5, "prune.rungs[0]"),
    "min_runs_over_the_sweep": (
        "name: x\nseeds: 2\nprune:\n  metric: test_acc\n  rungs: [2]\n  min_runs: 3\n",
        6,
        "prune.min_runs",
    ),
    "prune_mode_against_target_mode": (
        "name: x\nseeds: 3\ntarget:\n  metric: val_loss\n  value: 0.1\nprune:\n  mode: max\n  rungs: [2]\n",
        7,
        "prune.mode",
    ),
    "one_data_folder_written_two_ways": (
        "name: x\ndata:\n  - from: s3://bkt/a/\n    to: x\n  - from: s3://bkt/b/\n    to: ./x/\n",
        6,
        "data[1].to",
    ),
    "two_dots_in_a_bucket": ("name: x\nstore: s3://my..bucket/p\n", 2, "store"),
    "bucket_like_an_ip_address": ("name: x\ndata:\n  - from: s3://192.168.1.1/d/\n    to: d\n", 3, "data[0].from"),
    "max_runs_over_the_ceiling": ("name: x\nmax_runs: 1000000000\n", 2, "max_runs"),
    "one_tmux_session_for_two_runs": ("name: x\ncommand: echo {v}\ngrid:\n  v: ['.', '/']\n", 3, "grid"),
    "aws_heartbeat_that_three_beats_do_not_fit_in": (
        "name: x\nbackend: aws\nstore: s3://b/p\naws:\n  image: ami-1\n  heartbeat_s: 61\n",
        6,
        "aws.heartbeat_s",
    ),
    "aws_unknown_market": (
        "name: x\nbackend: aws\nstore: s3://b/p\naws:\n  image: ami-1\n  market: cheap\n",
        6,
        "aws.market",
    ),
}


# Were a bad store or bucket let through, the CLI would call S3: it must find a closed loopback port, never AWS.
OFFLINE_AWS = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_direct(tmp_path, case):
    text, line, field = BAD[case]
    p = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_sweep(p)
    msg = str(info.value)
    assert f"{p}:{line}:" in msg, msg
    assert field in msg, msg


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_sweep(tmp_path / "nope.yaml")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_cli_exits_2_without_traceback_and_launches_nothing(orch, case):
    orch.env.update(OFFLINE_AWS)
    text, line, field = BAD[case]
    path = orch.sweep(text)
    r = orch("launch", str(path))
    assert r.code == 2, (r.out, r.err)
    assert "Traceback" not in r.err + r.out
    assert f"{path}:{line}:" in r.err and field in r.err, r.err
    assert not (orch.home / "store").exists()
    assert orch.tmux("list-sessions").returncode != 0  # no tmux server was even started


def test_missing_file_cli(orch):
    r = orch("launch", str(orch.tmp / "missing.yaml"))
    assert r.code == 2 and "not found" in r.err and "Traceback" not in r.err


def test_expand_is_deterministic(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: x\ncommand: echo {a} {b}\ngrid:\n  b: [2, 1]\n  a: [x, y]\n"))
    assert [r.run_id for r in expand(sweep.spec)] == ["b=2,a=x", "b=2,a=y", "b=1,a=x", "b=1,a=y"]


def test_torchrun_placeholder_and_the_shape_environment(tmp_path):
    from orchestrator.host.env import complete_on_host
    from orchestrator.sweep.tasks import run_env

    sweep = load_sweep(write(tmp_path, "name: x\ncommand: '{torchrun} -m trainer'\nresources:\n  procs_per_node: 2\n"))
    command = sweep.runs[0].command
    assert command.startswith(shlex.quote(sys.executable) + ' -m torch.distributed.run --nnodes "$ORCH_NODES"')
    assert '--nproc-per-node "$ORCH_PROCS_PER_NODE"' in command and '--master-port "$ORCH_MASTER_PORT"' in command
    env = run_env(sweep, "run", 1, "/r", "{}")
    assert (env["ORCH_NODES"], env["ORCH_NODE_RANK"], env["ORCH_PROCS_PER_NODE"], env["ORCH_MASTER_ADDR"]) == (
        "1",
        "0",
        "2",
        "127.0.0.1",
    )
    host = complete_on_host(env)
    assert int(host["ORCH_MASTER_PORT"]) > 0 and host["ORCH_PROCS_PER_NODE"] == "2"
    auto = complete_on_host(run_env(load_sweep(write(tmp_path, "name: y\n")), "run", 1, "/r", "{}"))
    assert auto["ORCH_PROCS_PER_NODE"] == "1" and auto["ORCH_GPUS"] == "0"  # no GPU here: one process


def test_a_quoted_number_is_refused_with_the_number_to_write_instead(tmp_path):
    for text, fix in (
        ("name: x\ntarget:\n  metric: test_acc\n  value: '0.9'\n", "write the number without quotes: 0.9"),
        ("name: x\nmax_parallel: '2'\n", "write the number without quotes: 2"),
        ("name: x\ntimeout_minutes: 'ten'\n", "write a number, e.g. 0.5"),
    ):
        with pytest.raises(SpecError, match=fix):
            load_sweep(write(tmp_path, text))


def test_prune_mode_may_restate_target_or_serve_another_metric(tmp_path):
    agree = "target:\n  metric: val_loss\n  value: 0.1\nprune:\n  mode: min\n  rungs: [2]\n"
    other = "target:\n  metric: val_loss\n  value: 0.1\nprune:\n  metric: test_acc\n  mode: max\n  rungs: [2]\n"
    for extra in (agree, other):
        assert load_sweep(write(tmp_path, "name: x\nseeds: 3\n" + extra)).spec.prune.rungs == [2.0]
    with pytest.raises(SpecError, match="contradicts max \\(target's default for 'test_acc'\\)"):
        load_sweep(
            write(
                tmp_path,
                "name: x\nseeds: 3\ntarget: {metric: test_acc, value: 0.9}\nprune:\n  mode: min\n  rungs: [2]\n",
            )
        )


def test_a_data_folder_inside_its_own_source_is_refused_before_anything_runs(orch):
    source = orch.tmp / "cifar"
    source.mkdir()
    (source / "a.bin").write_bytes(b"x")
    for to in (source / "copy", source):
        path = orch.sweep(f"name: nest\ncommand: 'true'\ndata:\n  - from: cifar\n    to: {to}\n")
        r = orch("launch", str(path))
        assert r.code == 2 and "Traceback" not in r.err, r.err
        assert f"{path}:5: data[0].to:" in r.err and "its own `from:` folder" in r.err, r.err
        assert "Stage to a folder outside it" in r.err, r.err
    assert sorted(p.name for p in source.iterdir()) == ["a.bin"]  # nothing staged, no copy in the copy
    assert not (orch.home / "store").exists()
    # a relative `to:` lands under the work folder's .data/: inside the source when the work folder is
    path = orch.sweep(f"name: nest\ncommand: 'true'\nlocal:\n  workdir: {source}\ndata:\n  - from: cifar\n    to: d\n")
    r = orch("launch", str(path))
    assert r.code == 2 and f"{path}:7: data[0].to: 'd' ({source.resolve()}/.data/d) is inside" in r.err, r.err
    ok = orch.sweep(f"name: nest\ncommand: 'true'\ndata:\n  - from: cifar\n    to: {orch.tmp / 'elsewhere'}\n")
    assert orch("launch", str(ok), "--dry-run").code == 0


def test_a_collision_of_ids_or_of_tmux_sessions_names_both_runs(tmp_path):
    with pytest.raises(SpecError) as info:
        load_sweep(write(tmp_path, "name: x\ncommand: echo {v}\ngrid:\n  v: ['.', '/']\n"))
    assert "runs 'v=.' and 'v=_' get the same tmux session name 'orch_x_v=_'" in str(info.value), info.value
    with pytest.raises(SpecError) as info:
        load_sweep(write(tmp_path, "name: x\ncommand: echo {v}\ngrid:\n  v: ['a b', 'a_b']\n"))
    assert 'the same id \'v=a_b\' (from v: "a b" and v: "a_b")' in str(info.value), info.value


@pytest.mark.parametrize("store", ["S3://Bucket/x", "gs://bucket/x", "https://bucket.s3.amazonaws.com/x"])
def test_a_store_url_orch_does_not_know_is_refused_not_made_a_local_folder(orch, store):
    path = orch.sweep(f"name: x\nstore: {store}\ncommand: 'true'\n")
    for args in (("--dry-run",), ()):
        r = orch("launch", str(path), *args)
        assert r.code == 2 and "sweep.yaml:2: store: " in r.err and "is not a store orch knows" in r.err, r.err
        assert "write s3://bucket/prefix" in r.err and "Traceback" not in r.err
    assert not any(p.name.lower().startswith(("s3:", "gs:", "https:")) for p in orch.tmp.rglob("*"))  # no folder


@pytest.mark.parametrize(
    "bucket, why",
    [
        ("my..bucket", "no two dots in a row"),
        ("192.168.1.1", "IP address"),
        ("xn--bucket", "start with 'xn--'"),
        ("sthree-bucket", "start with 'sthree-'"),
        ("bucket-s3alias", "end with '-s3alias'"),
        ("bucket--ol-s3", "end with '--ol-s3'"),
        ("ab", "3 to 63 characters"),
        ("a" * 64, "3 to 63 characters"),
        ("My-Bucket", "lowercase letters"),
        ("-bucket", "begins and ends with a letter or digit"),
    ],
)
def test_bucket_names_follow_s3s_naming_rules_everywhere_one_is_given(orch, bucket, why):
    orch.env.update(OFFLINE_AWS)  # a name let through must fail on loopback, never reach AWS
    r = orch("launch", str(orch.sweep(f"name: x\nstore: s3://{bucket}/p\n")), "--dry-run")
    assert r.code == 2 and "sweep.yaml:2: store: not a valid s3://bucket/prefix URL: " in r.err and why in r.err, r.err
    r = orch("aws", "policy", "--bucket", bucket)
    assert r.code == 2 and why in r.err and "Traceback" not in r.err, r.err
    r = orch("data", "push", str(orch.tmp), f"s3://{bucket}/d/")
    assert r.code == 2 and why in r.err and "Traceback" not in r.err, r.err


def test_bucket_names_s3_accepts_are_accepted():
    from orchestrator.contract import bucket_problem

    for name in ("my-bucket", "my.bucket.1", "abc", "a" * 63, "1bucket", "xn-bucket", "bucket-s3"):
        assert bucket_problem(name) is None, name


def test_the_dry_run_says_what_target_and_prune_will_do(orch):
    path = orch.sweep(
        "name: goals\ncommand: echo {lr}\ngrid:\n  lr: [1, 2, 3]\ntarget: {metric: test_acc, value: 0.94}\n"
        "prune: {rungs: [2, 4], keep: 0.5, min_runs: 2}\n"
    )
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.err
    assert "target: test_acc >= 0.94; collect reports each run's time and dollars to it" in r.out, r.out
    assert "prune: compares test_acc (higher is better) at epoch 2, 4; a run outside the best 50% there" in r.out
    plain = orch("launch", str(orch.sweep("name: plain\ncommand: 'true'\n")), "--dry-run")
    assert "target:" not in plain.out and "prune:" not in plain.out, plain.out


@pytest.mark.timeout(60)
def test_max_runs_has_a_ceiling_so_a_dry_run_never_runs_out_of_memory(orch):
    r = orch(  # (a short timeout: were the ceiling gone, this would fill the memory; orch is then stopped)
        "launch", str(orch.sweep("name: big\nseeds: 100000000\nmax_runs: 1000000000\n")), "--dry-run", timeout=40
    )
    assert (
        r.code == 2 and "MemoryError" not in r.err and "max_runs: Input should be less than or equal to 100000" in r.err
    )
    r = orch("launch", str(orch.sweep("name: big\nseeds: 100000000\n")), "--dry-run", timeout=40)
    assert r.code == 2 and "over the 100,000 one sweep may hold" in r.err, r.err


def test_an_aws_heartbeat_that_three_beats_do_not_fit_in_is_refused_with_the_most_that_fits(orch):
    """A host silent for 180 s is lost and replaced: with `heartbeat_s: 240` every healthy host would be."""
    orch.env.update(OFFLINE_AWS)
    aws = "name: beat\nbackend: aws\nstore: s3://bucket-1/p\naws:\n  image: ami-1\n"
    path = orch.sweep(aws + "  heartbeat_s: 240\n")
    refused = orch("launch", str(path), "--dry-run")
    assert refused.code == 2 and "Traceback" not in refused.err, refused.err
    assert f"{path}:6: aws.heartbeat_s: 240 s is too long" in refused.err, refused.err
    assert "180 s" in refused.err and "at most 60" in refused.err, refused.err
    for fits in ("  heartbeat_s: 60\n", ""):
        load_sweep(orch.sweep(aws + fits))


def test_the_aws_agents_default_heartbeat_beats_three_times_before_the_controller_calls_a_host_lost(
    tmp_path, monkeypatch
):
    """The agent a sweep that leaves `heartbeat_s` out starts on AWS beats every 60 s; a host two and a half beats
    late is still waited for by the controller (the silence that means lost is 180 s)."""
    from orchestrator.backends.aws.backend import AwsBackend
    from orchestrator.backends.base import Host
    from orchestrator.control.decide import WAIT, decide
    from orchestrator.store.status import RUNNING, RunStatus

    for key, value in OFFLINE_AWS.items():  # building the backend makes clients; none is called
        monkeypatch.setenv(key, value)
    sweep = load_sweep(write(tmp_path, "name: beat\nbackend: aws\nstore: s3://bucket-1/p\naws:\n  image: ami-1\n"))
    backend = AwsBackend(sweep)
    task = backend.new_task(sweep.runs[0].run_id, 1, "true", "{}")
    assert task.heartbeat_s == 60
    now = 1_000_000.0
    late = RunStatus(run_id="run", state=RUNNING, attempt=1, heartbeat=now - 2.5 * task.heartbeat_s)
    host = Host(run_id="run", host_id="i-0abc", address="127.0.1.5", attempt=1)
    assert decide(late, host, 1, now, backend.stale_s, backend.start_timeout_s) == WAIT


@pytest.mark.parametrize("field", ["max_parallel", "max_restarts", "max_runs", "seeds"])
def test_counts_are_whole_numbers_not_strings_or_booleans(orch, field):
    for value in ("'2'", "true", "2.5"):
        path = orch.sweep(f"name: strict\ncommand: 'true'\n{field}: {value}\n")
        r = orch("launch", str(path), "--dry-run")
        assert r.code == 2 and field in r.err and "Traceback" not in r.err, (value, r.err)


@pytest.mark.slow
def test_env_keys_must_be_identifiers(orch, tmp_path):
    marker = tmp_path / "envkey-ran"
    path = orch.sweep(json.dumps({"name": "envkey", "command": "true", "env": {f"A;touch {marker};B": "1"}}))
    r = orch("launch", str(path))
    assert r.code == 2 and "env" in r.err and "letters, digits and '_'" in r.err, r.err
    no_traceback(r)
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_huge_sweeps_are_refused_at_once_with_the_count(orch):
    r = orch(
        "launch", str(orch.sweep("name: huge\ncommand: 'echo {seed}'\nseeds: 1000000000\n")), "--dry-run", timeout=40
    )
    assert r.code == 2 and "1000000000 runs" in r.err and "max_runs" in r.err, r.err
    grid = {"name": "wide", "command": "echo {a} {b}", "grid": {"a": list(range(400)), "b": list(range(300))}}
    r = orch("launch", str(orch.sweep(json.dumps(grid))), "--dry-run", timeout=40)
    assert r.code == 2 and "120000 runs" in r.err, r.err


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_expansion_is_linear_in_the_runs(tmp_path):
    from orchestrator.backends.registry import load_sweep

    p = tmp_path / "s.yaml"
    p.write_text(
        json.dumps(
            {
                "name": "big",
                "command": "echo {a} {b}",
                "grid": {"a": list(range(200)), "b": list(range(150))},
                "max_runs": 30000,
            }
        )
    )
    assert len(load_sweep(p).runs) == 30000  # quadratic id checks took minutes here


@pytest.mark.slow
def test_deeply_nested_yaml_is_a_clear_error(orch):
    r = orch("launch", str(orch.sweep("name: deep\nparams:\n  a: " + "[" * 5000 + "]" * 5000 + "\n")))
    no_traceback(r)
    assert r.code == 2 and "nested" in r.err, r.err


AWS = "name: x\nbackend: aws\nstore: s3://bucket/x\naws:\n  image: some-image\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, words",
    [
        ("name: x\nmax_parallel: true\n", ["max_parallel", "Fix:"]),
        ("name: x\ntimeout_minutes: .inf\n", ["timeout_minutes", "finite"]),
        ("name: " + "a" * 64 + "\n", ["63 characters"]),
        ("name: 123\n", ["name", "Fix:"]),
        ("name: x\ngrid:\n  lr: 0.1\n", ["grid.lr", "Fix: write a list, e.g. [0.1]"]),
        (AWS + "  regions: us-east-1\n", ["aws.regions", "Fix: write a list, e.g. [us-east-1]"]),
        (AWS + "  regions: [us-west-2, US-EAST-1]\n", ["aws.regions[1]", "Fix: write us-east-1"]),
        (AWS + "  regions: [' us-west-2']\n", ["aws.regions[0]", "Fix: write us-west-2"]),
        (AWS + "  regions: []\n", ["aws.regions", "Fix: give at least one"]),
        # a mapping where a list goes: the example fits the field, not the grid's numbers
        (AWS + "  regions: {a: 1}\n", ["sweep.yaml:6: aws.regions", "e.g. [us-east-1, us-west-2]"]),
        (AWS + "  instance_types: {a: 1}\n", ["aws.instance_types", "e.g. [g5.xlarge, g6.xlarge]"]),
        ("name: x\ngrid:\n  lr: {a: 1}\n", ["grid.lr", "e.g. [0.1, 0.2]"]),
        ("name: x\nenv:\n  A: 1\n", ["env.A", "Fix:"]),
        ("name: x\nseeds: two\n", ["seeds", "a count"]),
    ],
)
def test_wrong_field_values_are_clear_errors_naming_the_field(orch, text, words):
    r = orch("launch", str(orch.sweep(text)))
    no_traceback(r)
    assert r.code == 2, r.err
    for w in words:
        assert w in r.err, (w, r.err)


@pytest.mark.slow
def test_long_values_keep_distinct_ids_and_yaml_exponents_are_numbers(tmp_path):
    from orchestrator.backends.registry import load_sweep

    p = tmp_path / "s.yaml"
    a, b = "x" * 45 + "1", "x" * 45 + "2"
    p.write_text(f"name: ids\ncommand: echo {{v}} {{lr}}\ngrid:\n  v: [{a}, {b}]\n  lr: [1e-3, 3e-4]\n")
    runs = load_sweep(p).runs
    assert len({r.run_id for r in runs}) == 4
    assert {r.params["lr"] for r in runs} == {0.001, 0.0003}


def _bad(r, *words):
    assert r.code == 2, r.out + r.err
    assert "Traceback" not in r.err
    for w in words:
        assert w in r.err, r.err


@pytest.mark.parametrize(
    "resources, words",
    [
        ("{nodes: 1000}", ["resources.nodes", "64"]),
        ("{nodes: 99999999999999999999999}", ["resources.nodes"]),
        ("{gpus: 100000}", ["resources.gpus", "16"]),
        ("{procs_per_node: 100000}", ["resources.procs_per_node", "256"]),
        ("{nodes: 64, procs_per_node: 200}", ["resources.nodes", "per core"]),
    ],
)
def test_absurd_shapes_are_refused(orch, resources, words):
    path = orch.sweep(f"""
        name: absurd
        command: "true"
        resources: {resources}
    """)
    _bad(orch("launch", str(path), "--dry-run"), str(path), *words)


@pytest.mark.parametrize(
    "command, shown",
    [
        ("echo {v!r}", "{v!r}"),
        ("echo {torchrun.x}", "{torchrun.x}"),
        ("echo {v:>9}", "{v:>9}"),
        ("echo {v[0]}", "{v[0]}"),
    ],
)
def test_only_plain_placeholders(orch, tmp_path, command, shown):
    path = orch.sweep(f"""
        name: holders
        command: '{command}'
        grid:
          v: ["$(touch {tmp_path}/owned)"]
    """)
    _bad(orch("launch", str(path), "--dry-run"), "command", shown, "only plain {name}")
    assert not (tmp_path / "owned").exists()


@pytest.mark.parametrize(
    "section, wanted",
    [
        ("resources: {gpu: 1}", "did you mean `gpus`"),
        ("data: [{from: s3://b/p/, too: x}]", "did you mean `to`"),
        ("backend: aws\nstore: s3://b/p\naws: {image: ami-1, regionn: us-east-1}", "did you mean `region`"),
        ("backend: aws\nstore: s3://b/p\naws: {image: ami-1, ssh: {usr: ubuntu}}", "did you mean `user`"),
    ],
)
def test_nested_misspellings_get_the_hint_of_their_section(orch, section, wanted):
    path = orch.sweep(f"name: typo\ncommand: 'true'\n{section}\n")
    r = orch("launch", str(path), "--dry-run")
    _bad(r, wanted)
    assert "max_parallel" not in r.err  # not the top level's fields


@pytest.mark.parametrize(
    "entry, words",
    [
        ("{from: missing-folder, to: d}", ["data[0].from", "no such folder"]),
        ("{from: sweep.yaml, to: d}", ["data[0].from", "not a folder"]),
        ("{from: ., to: ../../outside}", ["data[0].to", "leaves orch's data folder"]),
    ],
)
def test_data_entries_that_cannot_work_are_validation_errors(orch, entry, words):
    path = orch.sweep(f"name: dataval\ncommand: 'true'\ndata: [{entry}]\n")
    _bad(orch("launch", str(path), "--dry-run"), *words)
    _bad(orch("launch", str(path)), *words)


def test_a_grid_value_is_shown_as_written_and_a_nul_in_one_is_refused_with_its_line(orch):
    """An emoji in a colliding value is printed as the file has it (not `\\ud83d\\ude80`); a NUL, which no command
    line can carry, is refused where it is instead of silently dropped from the command."""
    rocket = orch.sweep("name: x\ncommand: echo {v}\ngrid:\n  v: ['🚀 a', '🚀_a']\n")
    r = orch("launch", str(rocket), "--dry-run")
    assert r.code == 2 and '(from v: "🚀 a" and v: "🚀_a")' in r.err, r.err
    nul = orch.sweep('name: x\ncommand: echo {v}\ngrid:\n  v:\n    - ok\n    - "a\\0b"\n', "nul.yaml")
    for args in (("--dry-run",), ()):
        r = orch("launch", str(nul), *args)
        assert r.code == 2 and "nul.yaml:6: grid.v[1]: holds a NUL character" in r.err, r.err
        assert "Traceback" not in r.err
