"""The bundled trainer: DAWNBench-class CIFAR-10 training (DDP, mixed precision, one-cycle, progressive resizing)."""
