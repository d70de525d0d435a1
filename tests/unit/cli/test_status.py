"""`orch status`: what the live view shows of a run's newest metrics line."""

from __future__ import annotations

import sys


def test_status_shows_a_nan_in_the_newest_metrics_line(orch, tmp_path):
    """A diverged run must look diverged: its NaN loss is shown, not dropped beside the accuracy."""
    script = tmp_path / "diverges.py"
    script.write_text(
        "import os\n"
        "with open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a') as f:\n"
        '    f.write(\'{"step": 1, "train_loss": 2.5, "test_acc": 0.3}\\n\')\n'
        '    f.write(\'{"step": 2, "train_loss": NaN, "test_acc": 0.1, "grad_norm": Infinity}\\n\')\n'
    )
    path = orch.sweep(f"name: nan\ncommand: '{sys.executable} {script}'\nstore: store\nmax_restarts: 0\n")
    assert orch("launch", str(path)).code == 0
    r = orch("status", "nan")
    assert r.code == 0, r.out + r.err
    assert "test_acc=0.1" in r.out and "train_loss=nan" in r.out and "grad_norm=inf" in r.out, r.out
