"""TensorBoard: the store as event files (read back with TensorBoard's own EventAccumulator and HParams
plugin data), kept current pass after pass, and `orch tensorboard` rendered in a real headless browser."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip(
    "tensorboard", reason="the board extra (tensorboard) is part of the dev extras: scripts/test.sh installs it"
)

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

from orchestrator.backends.registry import load_sweep  # noqa: E402
from orchestrator.control.board import Board  # noqa: E402
from orchestrator.store.folder import LocalStore  # noqa: E402
from orchestrator.store.status import RunStatus, write_status  # noqa: E402
from orchestrator.wait import retry_until  # noqa: E402


def lines(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def make(tmp_path: Path):
    path = tmp_path / "tb.yaml"
    path.write_text(
        "name: tb\ncommand: 'true'\nstore: store\ngrid:\n  lr: [0.1, 0.2]\n  opt: [sgd, adam]\n"
        "target:\n  metric: test_acc\n  value: 0.9\n"
    )
    sweep = load_sweep(path)
    return sweep, LocalStore(str(tmp_path / "store"))


def put_run(store, run_id: str, data: bytes, state: str = "running") -> None:
    write_status(
        store,
        "tb",
        RunStatus(run_id=run_id, state=state, attempt=1, started_at=time.time(), first_started_at=time.time()),
    )
    store.put_bytes(f"tb/{run_id}/metrics.jsonl", data)


def accumulator(folder: Path) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def session_hparams(folder: Path) -> dict:
    acc = accumulator(folder)
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    return {
        k: (v.number_value if v.HasField("number_value") else v.string_value)
        for k, v in data.session_start_info.hparams.items()
    }


def test_every_run_and_metric_at_its_steps_with_hparams_and_no_doubled_steps(tmp_path):
    sweep, store = make(tmp_path)
    ids = [r.run_id for r in sweep.runs]
    put_run(
        store,
        ids[0],
        lines({"step": 1, "loss": 2.0, "test_acc": 0.5}, {"step": 2, "loss": 1.0, "test_acc": 0.95, "elapsed_s": 7.5}),
        state="succeeded",
    )
    # a resumed run: attempt 2 wrote steps 2 and 3 again (its checkpoint was at step 1), then went on
    put_run(
        store,
        ids[1],
        lines(
            {"step": 1, "loss": 3.0},
            {"step": 2, "loss": 2.5},
            {"step": 3, "loss": 2.4},
            {"step": 2, "loss": 2.6},
            {"step": 3, "loss": 2.2},
            {"step": 4, "loss": 2.0},
        ),
    )
    logdir = tmp_path / "board"
    board = Board(sweep, store, logdir)
    board.update()
    acc = accumulator(logdir / ids[0])
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.0), (2, 1.0)]
    assert [e.step for e in acc.Scalars("test_acc")] == [1, 2]
    assert acc.Scalars("hparams/reached")[-1].value == 1.0 and acc.Scalars("hparams/time_to_target_s")[-1].value == 7.5
    assert acc.Scalars("hparams/best_test_acc")[-1].value == pytest.approx(0.95)
    assert session_hparams(logdir / ids[0]) == {"lr": 0.1, "opt": "sgd", "seed": 0}
    resumed = accumulator(logdir / ids[1]).Scalars("loss")
    assert [e.step for e in resumed] == [1, 2, 3, 4], "a resumed run's curve has no duplicate steps"

    # a run that starts later appears in the next pass; only new lines are converted
    put_run(store, ids[2], lines({"step": 1, "loss": 9.0}))
    store.put_bytes(
        f"tb/{ids[1]}/metrics.jsonl", store.get_bytes(f"tb/{ids[1]}/metrics.jsonl") + lines({"step": 5, "loss": 1.5})
    )
    assert board.update() == 2
    assert [e.step for e in accumulator(logdir / ids[1]).Scalars("loss")] == [1, 2, 3, 4, 5]
    assert [e.value for e in accumulator(logdir / ids[2]).Scalars("loss")] == [9.0]
    board.close()

    # a new board over the same folder (orch tensorboard started again) continues: nothing is written twice
    again = Board(sweep, store, logdir)
    assert again.update() == 0
    again.close()
    assert [e.step for e in accumulator(logdir / ids[1]).Scalars("loss")] == [1, 2, 3, 4, 5]
    experiment = accumulator(logdir / ids[0]).PluginTagToContent("hparams")
    assert "_hparams_/experiment" in experiment
    assert not (logdir / ".").joinpath("events").exists() and all(p.name in ids for p in logdir.iterdir() if p.is_dir())


def test_collect_writes_event_files_and_a_missing_extra_is_a_clear_error(orch, tmp_path):
    sweep, store = make(tmp_path)
    for i, run in enumerate(sweep.runs):
        put_run(store, run.run_id, lines({"epoch": 1, "test_acc": 0.1 * i}), state="succeeded")
    r = orch("collect", str(sweep.path), "--out", str(tmp_path / "res"), "--tensorboard", str(tmp_path / "tbout"))
    assert r.code == 0, r.err
    assert sorted(p.name for p in (tmp_path / "tbout").iterdir() if p.is_dir()) == sorted(r.run_id for r in sweep.runs)
    # without tensorboard importable: the error names the install command
    blocker = tmp_path / "noboard"
    (blocker / "tensorboard").mkdir(parents=True)
    (blocker / "tensorboard" / "__init__.py").write_text("raise ImportError('not installed')\n")
    orch.env["PYTHONPATH"] = f"{blocker}:{orch.env['PYTHONPATH']}"
    r = orch("tensorboard", str(sweep.path))
    assert r.code == 2 and "pip install 'orch[board]'" in r.err and "Traceback" not in r.err, r.err


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("Debian's chromium is not installed and could not be (scripts/setup.sh installs it with apt-get)")
    return found


@pytest.mark.timeout(300)
def test_orch_tensorboard_in_a_real_browser_shows_every_run(orch, tmp_path):
    browser = chromium()
    sweep, store = make(tmp_path)
    ids = [r.run_id for r in sweep.runs]
    for i, rid in enumerate(ids[:3]):
        put_run(store, rid, lines(*({"step": s, "loss": 1.0 / (s + i), "test_acc": 0.2 * s} for s in range(1, 6))))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = orch.popen("tensorboard", str(sweep.path), "--port", str(port), "--logdir", str(tmp_path / "live"))
    try:
        url = f"http://127.0.0.1:{port}/"

        def answers():
            try:
                return urllib.request.urlopen(url + "data/runs", timeout=5).read()
            except OSError:
                return None

        retry_until(
            lambda: answers() and all(rid in json.loads(answers()) for rid in ids[:3]),
            120,
            0.5,
            "TensorBoard to list the runs",
        )
        put_run(store, ids[3], lines({"step": 1, "loss": 0.5}))  # a run that starts while orch tensorboard runs
        retry_until(lambda: ids[3] in json.loads(answers() or b"[]"), 60, 0.5, "the late run to appear")
        shot = tmp_path / "tensorboard.png"
        page = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--virtual-time-budget=15000",
                "--window-size=1400,900",
                "--dump-dom",
                url + "#timeseries",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        missing = [rid for rid in ids if rid not in page.stdout]
        assert not missing, f"not in the rendered page: {missing}\n{page.stderr[-2000:]}"
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--virtual-time-budget=15000",
                "--window-size=1400,900",
                f"--screenshot={shot}",
                url + "#timeseries",
            ],
            capture_output=True,
            timeout=120,
        )
        assert shot.exists() and shot.stat().st_size > 10_000
    finally:
        left = descendants(proc.pid)  # tensorboard and its data server
        proc.terminate()
        proc.wait(30)
        retry_until(lambda: not [p for p in left if alive(p)], 30, 0.1, "what orch tensorboard started to end")
    assert len(left) >= 2, left


def descendants(pid: int) -> list:
    """Every process below pid, from /proc."""
    children: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def serving(orch, tmp_path, *args):
    """`orch tensorboard` started and answering; (process, port, what it started)."""
    sweep, store = make(tmp_path)
    put_run(store, sweep.runs[0].run_id, lines({"step": 1, "loss": 0.5}))
    proc = orch.popen(  # SIGINT as from a terminal: a shell's background job (a CI runner's) starts with it ignored
        "tensorboard",
        str(sweep.path),
        "--port",
        "0",
        "--logdir",
        str(tmp_path / "live"),
        *args,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stdout.readline()
    assert "http://127.0.0.1:" in first, first + proc.stdout.read()
    port = int(first.split("http://127.0.0.1:")[1].split("/")[0])

    def answers():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5).read()
        except OSError:
            return None

    retry_until(answers, 60, 0.2, "TensorBoard to answer")
    retry_until(lambda: len(descendants(proc.pid)) >= 2, 60, 0.1, "tensorboard's data server")
    return proc, port, descendants(proc.pid)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])  # kill, a closed terminal, Ctrl-C
def test_orch_tensorboard_stops_the_tensorboard_it_started_on_any_signal(orch, tmp_path, sig):
    proc, port, started = serving(orch, tmp_path)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    assert "Traceback" not in out, out
    left = [p for p in started if alive(p)]
    assert not left, f"still running after orch tensorboard ended: {left}"
    with socket.socket() as s:
        # free again: no listener left. SO_REUSEADDR, as servers bind: the test's own connections to TensorBoard may
        # leave the port in TIME_WAIT, which refused a plain bind in a loaded run although nothing listened.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


@pytest.mark.timeout(200)
def test_tensorboard_and_collect_refuse_bad_folders_hosts_and_ports_clearly(orch, tmp_path):
    sweep, store = make(tmp_path)
    put_run(store, sweep.runs[0].run_id, lines({"step": 1e30, "loss": 0.5}, {"step": 2, "loss": 0.4}), "succeeded")
    r = orch("collect", str(sweep.path), "--out", str(tmp_path / "res"), "--tensorboard", str(tmp_path / "tb"))
    assert r.code == 0 and "Traceback" not in r.err, r.err
    for args in (
        ("collect", str(sweep.path), "--tensorboard", "/sys"),
        ("tensorboard", str(sweep.path), "--logdir", "/sys"),
    ):
        r = orch(*args)  # a folder that exists and cannot be written (not even by root)
        assert r.code == 2 and "cannot write the TensorBoard folder /sys" in r.err and "Traceback" not in r.err, r.err
        assert f"Pass another with {args[2]}" in r.err, r.err
    r = orch("tensorboard", str(sweep.path), "--host", "999.1.1.1", "--logdir", str(tmp_path / "x"))
    assert r.code == 2 and "--host 999.1.1.1" in r.err and "Traceback" not in r.err, r.err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = orch("tensorboard", str(sweep.path), "--port", str(port), "--logdir", str(tmp_path / "x"))
    assert r.code == 2 and f"port {port} on 127.0.0.1 is in use" in r.err and "http://" not in r.out, r.out + r.err


def test_a_metric_named_like_a_param_never_overwrites_the_swept_value(orch, tmp_path):
    import csv

    sweep, store = make(tmp_path)
    for run in sweep.runs:  # the trainer logs its scheduled learning rate as `lr`
        put_run(
            store, run.run_id, lines({"step": 1, "lr": 0.0005, "loss": 0.5}, {"step": 2, "lr": 0.000119}), "succeeded"
        )
    r = orch("collect", str(sweep.path), "--out", str(tmp_path / "res"), "--wide")
    assert r.code == 0, r.err
    rows = list(csv.DictReader(open(tmp_path / "res" / "runs.csv")))
    doc = json.loads((tmp_path / "res" / "runs.json").read_text())["runs"]
    for row, run, js in zip(rows, sweep.runs, doc):
        assert float(row["lr"]) == run.params["lr"] and js["lr"] == run.params["lr"], (row, js)
        assert float(row["metric.lr"]) == 0.000119 and js["metric.lr"] == 0.000119, (row, js)
    board = Board(sweep, store, tmp_path / "tb")
    board.update()
    board.close()
    for run in sweep.runs:
        assert session_hparams(tmp_path / "tb" / run.run_id)["lr"] == pytest.approx(run.params["lr"])


def test_lines_without_steps_over_three_passes_draw_each_point_once_and_a_last_line_without_newline_counts(tmp_path):
    sweep, store = make(tmp_path)
    rid = sweep.runs[0].run_id
    logdir = tmp_path / "board"
    board = Board(sweep, store, logdir)
    data = b""
    for p in range(3):  # lines with neither step nor epoch: their line number is their step
        data += lines(*({"loss": 10.0 * p + i} for i in range(2)))
        put_run(store, rid, data)
        assert board.update() == 2
        saved = json.loads((logdir / ".orch-board.json").read_text())["runs"][rid]
        assert saved["offset"] == len(data)  # what was read, not the whole file again next pass
    board.close()
    points = [(e.step, e.value) for e in accumulator(logdir / rid).Scalars("loss")]
    assert points == [(1, 0.0), (2, 1.0), (3, 10.0), (4, 11.0), (5, 20.0), (6, 21.0)], points

    # the run ends with a last line that has no newline: it is drawn, and final and best agree with collect
    other = sweep.runs[1].run_id
    put_run(store, other, lines({"step": 1, "test_acc": 0.5}) + b'{"step": 2, "test_acc": 0.97}', state="succeeded")
    again = Board(sweep, store, logdir)
    again.update()
    again.close()
    acc = accumulator(logdir / other)
    assert [(e.step, e.value) for e in acc.Scalars("test_acc")] == [(1, 0.5), (2, pytest.approx(0.97))]
    assert acc.Scalars("hparams/final_test_acc")[-1].value == pytest.approx(0.97)
    assert json.loads((logdir / ".orch-board.json").read_text())["runs"][other]["done"] is True
