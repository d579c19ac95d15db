"""A faster dropout for CPUs, active only inside a `with UniformDropout():` block in the thread that opened it.

transformers models call the function `torch.nn.functional.dropout`, not a module, so it cannot be swapped per
model. Rebinding it would change it for the whole process (every thread, every model, until someone restores
it); a torch function mode instead intercepts the calls made inside its block, in its thread, and nothing else.

`uniform_dropout` draws the same Bernoulli(1 - p) keep mask as PyTorch (as uniform >= p) with the same
1 / (1 - p) scaling, from the same generator, but through `rand_like` instead of `bernoulli_`, which is slower on
CPUs (bench/README.md has the figures). The masks differ from PyTorch's own, so a CPU run and a GPU run (which
keeps PyTorch's dropout) draw different masks from the same seed; runs on the same device type repeat exactly.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def uniform_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.dropout's contract (keep with probability 1 - p, scale by 1 / (1 - p)); never in place."""
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return torch.zeros_like(x)
    return x * (torch.rand_like(x) >= p) * (1.0 / (1.0 - p))


class UniformDropout(TorchFunctionMode):
    """Inside the block, calls of torch.nn.functional.dropout run uniform_dropout; every other call passes through."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.dropout:
            return uniform_dropout(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def training_dropout(device: torch.device) -> AbstractContextManager:
    """The block for a training forward pass on `device`: uniform masks on CPUs, PyTorch's own elsewhere."""
    return UniformDropout() if device.type == "cpu" else nullcontext()
