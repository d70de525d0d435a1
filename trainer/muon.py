"""Muon: momentum SGD whose update of each filter bank is orthogonalized (Keller Jordan, 2024).

The update of a weight of shape (out, ...) is its Nesterov-momentum gradient, reshaped to a matrix
(out x rest) and replaced by an approximation of its orthogonal factor: three steps of a quintic
Newton-Schulz iteration in bfloat16, with the coefficients (3.4445, -4.7750, 2.0315) that push the
singular values towards 1 fast (to roughly 0.5-1.5, which trains as well as the exact factor).
Before each step the weight itself is rescaled to norm sqrt(out). As airbench94_muon.py uses it
for the conv filters (there: lr 0.24, momentum 0.6, Nesterov, no weight decay).
"""

from __future__ import annotations

import torch

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: torch.Tensor, steps: int = 3, eps: float = 1e-7) -> torch.Tensor:
    """An approximate orthogonal factor of the matrix g (its singular values pushed towards 1)."""
    a, b, c = NS_COEFFS
    x = g.bfloat16()
    x = x / (x.norm() + eps)  # every singular value at most 1
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True):
        if lr < 0 or momentum < 0 or (nesterov and momentum <= 0):
            raise ValueError(f"Muon: lr {lr} and momentum {momentum} must be >= 0 (Nesterov needs momentum > 0)")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                buf.mul_(mu).add_(p.grad)
                g = p.grad.add(buf, alpha=mu) if group["nesterov"] else buf
                p.mul_(len(p) ** 0.5 / p.norm())
                p.add_(orthogonalize(g.reshape(len(g), -1)).view(g.shape).to(p.dtype), alpha=-lr)
        return None
