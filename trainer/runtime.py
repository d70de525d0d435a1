"""The trainer's surroundings: processes and devices, precision, signals, the metrics file, and
the optimizer's parameter groups."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from .presets import Config
from .validate import CHOICES


def setup_distributed(device_kind: str):
    """(rank, world, local_rank) from the torchrun environment; one process without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return rank, world, local


def pick_device(kind: str, local_rank: int) -> torch.device:
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def pick_precision(precision: str, device: torch.device) -> str:
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16"


def skip_dynamo_import() -> None:
    """Without torch.compile nothing traces the optimizer, so the `import torch._dynamo` that torch makes at the first
    call of its state_dict, zero_grad and friends (to wrap them in dynamo's `disable`) buys nothing and costs 1.8 s of
    CPU at every start. torch caches that wrapper on the wrapped function (torch/_compile.py): handing it the function
    itself skips the import and leaves every call as it was. One this misses costs the import again, nothing else
    (tests/unit/trainer/test_train.py checks that a run and its resume import none). DDP imports it in its
    constructor anyway."""
    import sys

    if "torch._dynamo" in sys.modules:
        return
    import torch._compile
    from torch.optim import Optimizer

    lazy = torch._compile._disable_dynamo(lambda: None).__code__  # the code of every lazily disabled function
    for fn in vars(Optimizer).values():
        raw = getattr(fn, "__wrapped__", None)
        if getattr(fn, "__code__", None) is lazy and raw is not None:
            raw.__dynamo_disable = raw


class SGD(torch.optim.SGD):
    """torch's SGD, stepping as torch's does when torch.compile does not trace the step (the trainer never compiles
    it, only the network): without grad. torch's own step imports torch._dynamo at its first call for a graph break
    that only a traced step needs (1.8 s of CPU at every start)."""

    def step(self, closure=None):
        if self.defaults["differentiable"]:  # a step to differentiate through: torch's own, grad and all
            return super().step(closure)
        with torch.no_grad():
            return _TORCH_SGD_STEP(self, closure)


_TORCH_SGD_STEP = inspect.unwrap(torch.optim.SGD.step)  # sgd.py's own step, under torch's wrappers


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


COMPILE_MODES = CHOICES["compile_mode"]


def check_compile_mode(mode: str) -> None:
    if mode not in COMPILE_MODES:
        raise SystemExit(f"trainer: compile_mode {mode!r} is not one of {', '.join(COMPILE_MODES)}")


def compile_net(net: nn.Module, mode: str) -> nn.Module:
    """torch.compile with static shapes: each image and batch size of the run gets a graph (and, in the CUDA-graph
    modes, a recorded CUDA graph) of its own, compiled in the warm-up before the clock starts."""
    check_compile_mode(mode)
    return torch.compile(net, mode=None if mode == "default" else mode, dynamic=False)


def uses_cuda_graphs(cfg: Config, device: torch.device) -> bool:
    """Whether the compiled step replays CUDA graphs (inductor's cudagraph trees; only on CUDA)."""
    return cfg.compile and device.type == "cuda" and cfg.compile_mode in ("reduce-overhead", "max-autotune")


def code_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def param_groups(model: nn.Module, weight_decay: float):
    """Weight decay on conv and linear weights only: never on BatchNorm or biases."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Signals:
    """SIGUSR1: checkpoint now and go on. SIGTERM: checkpoint now and exit."""

    def __init__(self):
        self.checkpoint = False
        self.exit = False
        signal.signal(signal.SIGUSR1, self._usr1)
        signal.signal(signal.SIGTERM, self._term)

    def _usr1(self, *_):
        self.checkpoint = True

    def _term(self, *_):
        self.checkpoint = self.exit = True


class MetricsLog:
    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled

    def write(self, row: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                # strict JSON: a non-finite number (a diverged loss) is null, not NaN, which JSON readers refuse
                f.write(
                    json.dumps(
                        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
                    )
                    + "\n"
                )


class StepTimer:
    """Training time without a host synchronisation per step: on CUDA a pair of events per step, read
    (one sync) only when the total is asked for; on the CPU the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: list = []
        self.t0 = 0.0
        self.done_s = 0.0

    def start(self) -> None:
        if self.cuda:
            self.pending.append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
            self.pending[-1][0].record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.pending[-1][1].record()
        else:
            self.done_s += time.perf_counter() - self.t0

    def take(self) -> float:
        """Seconds of the steps timed since the last take (syncs once on CUDA)."""
        if self.cuda and self.pending:
            self.pending[-1][1].synchronize()
            self.done_s += sum(a.elapsed_time(b) for a, b in self.pending) / 1000
            self.pending = []
        seconds, self.done_s = self.done_s, 0.0
        return seconds


def ema_update(ema: nn.Module, model: nn.Module, decay: float, pairs: list) -> None:
    """ema = decay * ema + (1 - decay) * model for floating tensors (one multi-tensor op each), a copy
    for the others (BatchNorm's counters). `pairs` caches the tensor lists: ([ema floats], [model floats], [others])."""
    if not pairs:
        e_sd, m_sd = ema.state_dict(), model.state_dict()
        floats = [k for k, v in e_sd.items() if v.dtype.is_floating_point]
        pairs += [
            [e_sd[k] for k in floats],
            [m_sd[k] for k in floats],
            [(e_sd[k], m_sd[k]) for k in e_sd if k not in floats],
        ]
    e, m, others = pairs
    with torch.no_grad():
        torch._foreach_mul_(e, decay)
        torch._foreach_add_(e, m, alpha=1 - decay)
        for a, b in others:
            a.copy_(b)


def fold_loss(acc: torch.Tensor, world: int) -> float:
    """The loss summed on the device since the last call (averaged over ranks), read once; acc is reset."""
    if world > 1:
        torch.distributed.all_reduce(acc)
        acc /= world
    value = float(acc)
    acc.zero_()
    return value


@dataclass
class Process:
    """Where this process trains: its rank of `world` (torchrun's environment; rank 0 of 1 without it), its device
    and precision, and the output folder."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    precision: str  # fp32 | fp16 | bf16: --precision with auto resolved for the device
    out: Path

    @property
    def is_main(self) -> bool:  # rank 0 logs and writes config.json, metrics, checkpoints and the summary
        return self.rank == 0


def start_run(cfg: Config) -> Process:
    """What every training run does first: the process group (under torchrun), the device and its
    precision, CPU threads, and the output folder with config.json (rank 0)."""
    device_kind = "cuda" if (cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())) else "cpu"
    rank, world, local_rank = setup_distributed(device_kind)
    device = pick_device(cfg.device, local_rank)
    precision = pick_precision(cfg.precision, device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if not cfg.compile:
        skip_dynamo_import()
    out = Path(cfg.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (out / "config.json").write_text(json.dumps({**asdict(cfg), "code_sha256": code_hash()}, indent=2) + "\n")
    return Process(rank, world, local_rank, device, precision, out)
