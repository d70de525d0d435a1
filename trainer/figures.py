"""The README's speed table, measured on this machine in one command.

    python -m trainer.figures [--data-dir DIR] [--json FILE]   # on a CUDA GPU: about 5 minutes on an H200
    python -m trainer.figures --small                          # the same wiring on a CPU in a minute or two

One after the other, on the same data (DIR/cifar-10-batches-py, or 50,000 + 10,000 generated
images in that format): Keller Jordan's airbench94 (the `bench` extra; CUDA only), our `--preset
fast` end to end, `fast` compiled with CUDA graphs (`--compile true --compile-mode
reduce-overhead`, compilation outside the clock), `fast-muon`, `resnet9` and `dawnbench-rn18` end
to end, then the achieved TFLOP/s of the fast, resnet9 and dawnbench-rn18 steps
(`python -m trainer.bench`). Prints a Markdown table; `--json FILE` keeps every figure. A row
that cannot run here (airbench without CUDA) says why and the others still run. `--small`: 400 +
100 images, one epoch, narrow nets, one thread, no compiled row: it checks the command, not the speed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from . import bench, bench_reference

SMALL_ARGS = ["--epochs", "1", "--width", "0.25", "--batch-size", "100", "--threads", "1"]
GRAPHS = ["--compile", "true", "--compile-mode", "reduce-overhead"]


def rows(data_dir: str | None, small: bool) -> list[dict]:
    n_train, n_test = (400, 100) if small else (50_000, 10_000)
    root = bench_reference.prepare_data(data_dir, n_train, n_test)
    try:
        return _measure(root, small)
    finally:
        if not data_dir:  # generated here: removed here (with airbench's copy of it)
            shutil.rmtree(root, ignore_errors=True)


def _measure(root: Path, small: bool) -> list[dict]:
    extra = SMALL_ARGS if small else []
    out: list[dict] = []
    try:
        out.append(dict(bench_reference.run_airbench94(root), what="airbench94 (reference, the airbench package)"))
    except bench_reference.BenchError as exc:
        out.append({"what": "airbench94 (reference, the airbench package)", "error": str(exc)})
    runs = [
        ("--preset fast", "fast", []),
        ("--preset fast-muon", "fast-muon", []),
        ("--preset resnet9", "resnet9", []),
        ("--preset dawnbench-rn18", "dawnbench-rn18", []),
    ]
    if not small:  # compiling on a CPU takes minutes and says nothing of CUDA graphs
        runs.insert(1, ("--preset fast, compiled, CUDA graphs", "fast", GRAPHS))
    for what, preset, args in runs:
        try:
            out.append(dict(bench_reference.run_ours(root, preset, [*args, *extra]), what=what))
        except bench_reference.BenchError as exc:
            out.append({"what": what, "error": str(exc)})
    for preset in ("fast", "resnet9", "dawnbench-rn18"):
        step = bench.run(
            preset, 2 if small else 30, 1 if small else 5, 64 if small else None, "auto", 0.25 if small else None
        )
        out.append(
            {
                "what": f"{preset} step (trainer.bench)",
                "achieved_tflops": step["achieved_tflops"],
                "step_images_per_s": step["images_per_s"],
                "batch_size": step["batch_size"],
                "device": step["device_name"],
            }
        )
    return out


def table(found: list[dict]) -> str:
    lines = [
        "| what | epochs | training time | images/s (end to end) | steady images/s | TFLOP/s | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in found:

        def cell(key, fmt="{}"):
            return fmt.format(r[key]) if r.get(key) is not None else ""

        note = r.get("error", "")
        if r.get("compile_s"):
            note = f"compile {r['compile_s']} s outside; CUDA graphs: {r.get('cuda_graphs')}"
        if "step_images_per_s" in r:
            note = f"{r['step_images_per_s']} images/s in the step, batch {r['batch_size']}"
        lines.append(
            f"| {r['what']} | {cell('epochs')} | {cell('train_time_s', '{} s')} | {cell('images_per_s')} | "
            f"{cell('steady_images_per_s')} | {cell('achieved_tflops')} | {note} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer.figures", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-dir", help="a folder holding cifar-10-batches-py (default: generated images in its format)")
    p.add_argument("--small", action="store_true", help="tiny data, one epoch, narrow nets: check the command on a CPU")
    p.add_argument("--json", help="also write every figure to this file")
    a = p.parse_args(argv)
    try:
        found = rows(a.data_dir, a.small)
    except bench_reference.BenchError as exc:
        sys.stderr.write(f"trainer.figures: {exc}\n")
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(found, indent=2) + "\n")
    sys.stdout.write(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
