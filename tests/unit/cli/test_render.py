"""What the CLI draws (cli/render.py): `orch collect`'s results table at any terminal width."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_collect_in_80_columns_cuts_no_id_state_or_number(orch):
    script = orch.tmp / "metrics.py"
    script.write_text(
        "import json, os\nrow = dict(epoch=1, train_loss=0.123456, test_acc=0.791234, lr=0.01, images_per_s=12345.6)\n"
        "open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'w').write(json.dumps(row) + '\\n')\n"
    )
    path = orch.sweep(f"""
        name: narrow
        command: "{{python}} {script}"
        grid:
          lr: [0.001, 0.002, 0.003]
          batch_size: [64, 128]
        max_parallel: 3
        store: store
    """)
    assert orch("launch", str(path), timeout=200).code == 0
    orch.env["COLUMNS"] = "80"
    r = orch("collect", "narrow", "--out", str(orch.tmp / "res"))
    assert r.code == 0, r.err
    table = r.out.split("wrote")[0]
    assert "…" not in table and "..." not in table, table
    assert max(len(x) for x in table.splitlines()) <= 80, table
    for lr in ("0.001", "0.002", "0.003"):
        for bs in ("64", "128"):
            assert f"lr={lr},batch_size={bs}" in table, table
    assert table.count("succeeded") == 6 and "0.7912" in table
    wide = orch("collect", "narrow", "--out", str(orch.tmp / "res2"), "--wide")
    assert wide.code == 0 and "best test_acc" in wide.out and "not shown" not in wide.out, wide.out


@pytest.mark.parametrize("columns,wide", [("60", False), ("40", False), ("80", True)])
def test_collect_never_cuts_ids_states_or_times_however_narrow(orch, columns, wide):
    import json
    import time

    from orchestrator.backends.registry import load_sweep
    from orchestrator.store.folder import LocalStore
    from orchestrator.store.status import RunStatus, write_status

    path = orch.sweep("""
        name: cut
        command: 'true'
        grid:
          learning_rate: [0.001, 0.002]
          batch_size: [64, 128]
        store: store
    """)
    sweep, store = load_sweep(path), LocalStore(str(orch.store()))
    for run in sweep.runs:
        now = time.time()
        write_status(
            store,
            "cut",
            RunStatus(run_id=run.run_id, state="succeeded", attempt=1, started_at=now - 3723, finished_at=now),
        )
        row = {"epoch": 3, "train_loss": 0.123456, "test_acc": 0.791234, "val_acc": 0.5, "val_loss": 1.5}
        store.put_bytes(f"cut/{run.run_id}/metrics.jsonl", (json.dumps(row) + "\n").encode())
    orch.env["COLUMNS"] = columns
    r = orch("collect", str(path), "--out", str(orch.tmp / "res"), *(["--wide"] if wide else []))
    assert r.code == 0, r.err
    table = r.out.split("wrote")[0]
    assert "…" not in table, table
    ids, states = [], []  # an id may wrap over lines (its next line has no state), never be cut
    for line in table.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")[1:-1]]
            if cells[1]:
                ids.append(cells[0])
                states.append(cells[1])
            else:
                ids[-1] += cells[0]
    assert sorted(ids) == sorted(r.run_id for r in sweep.runs) and states == ["succeeded"] * 4, table
    if wide:
        assert "best test_acc" in table and "not shown" not in table, table
