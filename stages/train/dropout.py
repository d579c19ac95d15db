"""A faster dropout for CPUs, active only inside a `with CpuDropout():` block in the thread that opened it.

transformers models call the function `torch.nn.functional.dropout`, not a module, so it cannot be swapped per
model. Rebinding it would change it for the whole process (every thread, every model, until someone restores
it); a torch function mode instead intercepts the calls made inside its block, in its thread, and nothing else.

`cpu_dropout` keeps each value with probability 1 - p and scales the kept ones so that the expectation is
unchanged, as PyTorch's dropout does, but draws its keep mask from 16-bit random integers: one 64-bit draw of the
generator gives four masks, where PyTorch's `bernoulli_` (and a `rand_like(x) >= p` mask) spends one draw and a
float conversion on each. p is rounded to a multiple of 1/65536 and the scale is that of the rounded p, so the
expectation stays exact. The masks differ from PyTorch's own, so a CPU run and a GPU run (which keeps PyTorch's
dropout) draw different masks from the same seed; runs on the same device type repeat exactly, and gradient
checkpointing's recomputation redraws the same masks (it restores the generator's state).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

MASK_LEVELS = 1 << 16  # the resolution of p: a value is dropped where its 16-bit draw falls in the first p of them


def cpu_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.dropout's contract (keep with probability 1 - p, scale by 1 / (1 - p)); never in place."""
    dropped = round(p * MASK_LEVELS)
    if not training or dropped == 0:
        return x
    if dropped == MASK_LEVELS:
        return torch.zeros_like(x)
    n = x.numel()
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(1 << 63), None)  # all 64 bits
    keep = draws.view(torch.int16)[:n].view(x.shape) >= dropped - MASK_LEVELS // 2
    return x * keep * (MASK_LEVELS / (MASK_LEVELS - dropped))


class CpuDropout(TorchFunctionMode):
    """Inside the block, calls of torch.nn.functional.dropout run cpu_dropout; every other call passes through."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.dropout:
            return cpu_dropout(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def training_dropout(device: torch.device) -> AbstractContextManager:
    """The block for a training forward pass on `device`: the faster masks on CPUs, PyTorch's own elsewhere."""
    return CpuDropout() if device.type == "cpu" else nullcontext()
