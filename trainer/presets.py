"""The trainer's defaults and named presets: plain data, no PyTorch (`python -m trainer` checks every option
against them before it imports PyTorch, so a bad option is a clear line at once)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Config:
    """Every option of a run, with its default: `python -m trainer --help` shows each trailing comment (validate.py
    reads them from this block), and a flag, a preset, a --config file or $ORCH_PARAMS_JSON sets them by name."""

    # fmt: off
    dataset: str = "cifar10"      # cifar10 | synthetic | digits | imagefolder (DIR/train/<class>/*, DIR/val/<class>/*)
    data_dir: str = "~/.cache/orch/data"  # cifar-10-batches-py is there (downloaded when missing), or the image folder
    image_size: int = 32          # side the data set is loaded at (digits and synthetic are resized to it)
    model: str = "resnet9"        # resnet9 | preact_resnet18 | wide_resnet | airbench | resnet18 | resnet50
    width: float = 1.0            # channel multiplier (all but wide_resnet)
    depth: int = 22               # wide_resnet depth (6n+4)
    widen: int = 6                # wide_resnet widening factor
    concat_pool: bool = True      # preact_resnet18: concat average and max pooling
    epochs: int = 24              # passes over the training set
    batch_size: int = 512         # global batch, split evenly over DDP ranks
    batch_sizes: str = ""         # progressive batch 'B@progress,...' e.g. '512@0,224@0.45' (lr scales by B/batch_size)
    lr: float = 0.4               # peak learning rate
    schedule: str = "one_cycle"   # one_cycle | piecewise
    lr_points: str = "0@0,1@0.2,0@1"  # piecewise: lr multiplier at progress points
    warmup: float = 0.25          # one_cycle: fraction of training spent rising to the peak
    momentum_max: float = 0.95    # one_cycle: momentum at the start and end (cycled inversely to lr)
    momentum_min: float = 0.85    # one_cycle: momentum at the lr peak (also piecewise's momentum)
    nesterov: bool = True         # Nesterov momentum
    weight_decay: float = 5e-4    # on conv/linear weights only
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    sizes: str = ""               # progressive resizing 'side@progress,...' e.g. '24@0,32@0.5' ('' = image_size)
    crop_pad: int = 4             # random-crop reflect padding (0 = no crop); tensor data sets
    min_scale: float = 0.35       # imagefolder: random-resized-crop's smallest area fraction
    val_size: int = 0             # imagefolder: validation side (0 = the last of --sizes)
    val_rect: bool = False        # imagefolder: validate aspect-preserving rectangles, not a center crop
    workers: int = 0              # imagefolder: reader/decoder threads (0 = min(16, cores))
    flip: bool = True             # random horizontal flips
    tta: bool = False             # evaluate on image + its mirror
    ema: float = 0.0              # EMA decay of weights used for evaluation (0 = off)
    whiten_bias_epochs: int = 3   # airbench: epochs the whitening conv's bias trains before it freezes
    precision: str = "auto"       # auto | fp32 | fp16 | bf16 (auto: bf16 on Ampere+, fp16 older GPUs, fp32 CPU)
    compile: bool = False         # torch.compile the model (compiled before the clock starts: summary.json's compile_s)
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs
    device: str = "auto"          # auto | cpu | cuda
    threads: int = 0              # CPU threads (0 = torch's default / OMP_NUM_THREADS)
    seed: int = 0                 # seeds init, data order and augmentation
    out: str = ""                 # output folder ('' = $ORCH_RUN_DIR, else runs/trainer)
    resume: str = "auto"          # auto (newest verified checkpoint in out) | never | a checkpoint folder
    ckpt_every_s: float = 300.0   # checkpoint at least this often (0 = not by time)
    ckpt_every_epochs: int = 1    # checkpoint every N epochs (0 = not by epoch)
    ckpt_keep: int = 2            # checkpoints kept in out/ckpt
    target_acc: float = 0.94      # summary.json reports the training time to reach it
    log_every: int = 0            # also write a metrics line every N steps (0 = once per epoch)
    max_steps: int = 0            # stop after this many steps (0 = run all epochs); for tests
    synthetic_train: int = 2048   # synthetic: training images (test: a quarter)
    recipe: str = ""              # '' | airbench94_muon: the published recipe, as recipe_muon.py hands it to the loop
    preset: str = ""              # the preset the options started from ('' = none; set by config.resolve_config)
    # fmt: on


DEFAULTS = {f.name: f.default for f in fields(Config) if f.name != "preset"}  # what a flag, file or preset may set

PRESETS = {
    "dawnbench-rn18": dict(
        model="preact_resnet18",
        concat_pool=True,
        epochs=30,
        batch_size=512,
        lr=0.4,
        weight_decay=5e-4,
        sizes="24@0,32@0.5",
        label_smoothing=0.0,
    ),
    "dawnbench-wrn": dict(model="wide_resnet", depth=22, widen=6, epochs=30, batch_size=512, lr=0.4, weight_decay=5e-4),
    "resnet9": dict(model="resnet9", epochs=24, batch_size=512, lr=0.4, weight_decay=5e-4, label_smoothing=0.2),
    "fast-muon": dict(
        recipe="airbench94_muon",
        model="airbench_muon",
        epochs=8,
        batch_size=2000,
        label_smoothing=0.2,
        whiten_bias_epochs=3,
        crop_pad=2,
        flip=True,
        tta=True,
        ema=0.0,
    ),  # trainer/recipe_muon.py: the published recipe
    "fast": dict(
        model="airbench",
        epochs=10,
        batch_size=1024,
        lr=0.6,
        weight_decay=5e-4,
        label_smoothing=0.2,
        tta=True,
        ema=0.99,
        crop_pad=2,
        warmup=0.2,
    ),
    "imagenet-rn50": dict(
        dataset="imagefolder",
        model="resnet50",
        epochs=30,
        batch_size=1024,
        lr=1.0,
        warmup=0.15,
        batch_sizes="1024@0,512@0.45,256@0.9",
        sizes="128@0,224@0.45,288@0.9",
        val_size=288,
        label_smoothing=0.1,
        weight_decay=5e-5,
        min_scale=0.35,
        crop_pad=0,
        ckpt_every_s=900.0,
        target_acc=0.76,
    ),
    "imagenette-rn18": dict(
        dataset="imagefolder",
        model="resnet18",
        epochs=20,
        batch_size=256,
        lr=1.0,
        warmup=0.2,
        sizes="128@0,160@0.5,192@0.85",
        val_size=192,
        label_smoothing=0.1,
        weight_decay=5e-5,
        min_scale=0.35,
        crop_pad=0,
        target_acc=0.9,
    ),
    "digits": dict(
        dataset="digits",
        image_size=16,
        model="resnet9",
        width=0.25,
        epochs=12,
        batch_size=64,
        lr=0.2,
        crop_pad=1,
        flip=False,
        label_smoothing=0.1,
        weight_decay=5e-4,
        sizes="12@0,16@0.4",
        ckpt_every_s=0.0,
        ckpt_every_epochs=2,
    ),
}
