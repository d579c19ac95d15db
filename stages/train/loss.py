"""The training objective: summed label-smoothed cross entropy over a batch's real target tokens.

`TokenLoss` wraps the model so that DDP wraps the whole objective (its hooks need the forward that DDP runs). It
runs the family's base model (encoder + decoder), then the output projection on the real target positions only
(`target_positions`, computed on the host by the collator, so no device sync asks which rows are padding), so
the largest matmul and everything after it skip the padding. Marian and mBART add `final_logits_bias` to the
logits; it is a buffer that training never changes, all zeros in the models built here (OPUS-MT checkpoints carry
Marian's output bias in it), so it is added only where it is not zero: a zero add would cost a full pass over the
logits.

On CPUs the loss runs through `SmoothedCrossEntropy`: a hand-written forward that reads the bf16 (or fp32) logits a
few rows at a time in fp32 and computes the loss and its gradient in one pass, writing the gradient once, in the
logits' dtype. PyTorch's `cross_entropy(label_smoothing=...)` instead casts the whole logits tensor to fp32, writes
the log-softmax, a zero-filled gradient, the smoothing's gradient and the log-softmax's gradient each as a full fp32
tensor, several times the memory traffic (bench/README.md has the profile before and after). GPUs keep PyTorch's
fused kernels, which this chunked loop was not measured against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# Logits elements per chunk on CPUs: 2**19 (2 MiB in fp32), so that each pass over a chunk finds it in cache.
CPU_CHUNK_ELEMENTS = 1 << 19


class SmoothedCrossEntropy(torch.autograd.Function):
    """sum over rows of logsumexp(x) - (1 - eps) x[target] - eps mean(x), exactly PyTorch's label-smoothed cross
    entropy with reduction="sum"; its gradient is softmax(x) - (1 - eps) onehot(target) - eps / V.

    The loss is the last op of the graph, so where the logits need a gradient (in training, not in validation)
    the forward computes it too, from the same fp32 chunk and the same exponentials as the log-sum-exp, times
    `grad_scale`, the factor the loop will scale the loss by (1 / the update's target tokens), and keeps it in the
    logits' dtype, in place of the logits, for the backward. Computed in the backward instead, each chunk would be
    read and cast to fp32 again and its exponentials taken twice; scaled in the backward, the whole gradient would
    be read and written once more, out of cache (bench/train_loss.py). A backward that brings another factor than
    `grad_scale` gets a correct gradient all the same, rescaled (and rounded twice)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, smoothing: float,
                grad_scale: float = 1.0) -> torch.Tensor:
        rows, vocab = logits.shape
        chunk = max(1, CPU_CHUNK_ELEMENTS // vocab)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        wants_grad = ctx.needs_input_grad[0]  # not for a validation loss, computed without autograd
        grad = torch.empty_like(logits) if wants_grad else None
        in_grad = wants_grad and logits.dtype == torch.float32
        on_target = torch.full((1, 1), -(1.0 - smoothing) * grad_scale, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, chunk):
            x = logits[start:start + chunk].float()
            picked = x.gather(1, target[start:start + chunk, None])
            total -= (1.0 - smoothing) * picked.sum() + (smoothing / vocab) * x.sum()
            top = x.amax(dim=1, keepdim=True)
            # Not in place: x is the logits themselves when they are fp32; their gradient's rows are then written
            # where it goes, with no copy at the end.
            p = torch.sub(x, top, out=grad[start:start + chunk]) if in_grad else x - top
            p.exp_()
            norm = p.sum(dim=1, keepdim=True)
            total += (top + norm.log()).sum()  # logsumexp(x), row by row
            if not wants_grad:
                continue
            p.mul_(norm.reciprocal_().mul_(grad_scale))  # softmax, scaled
            p.sub_(smoothing / vocab * grad_scale)
            p.scatter_add_(1, target[start:start + chunk, None], on_target.expand(p.shape[0], 1))
            if not in_grad:
                grad[start:start + chunk] = p  # rounded to the logits' dtype
        ctx.save_for_backward(grad)
        # The factor as the backward will bring it: the loop's scale, a Python float, multiplies an fp32 loss.
        ctx.grad_scale = torch.tensor(grad_scale, dtype=torch.float32).item()
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        if grad_total.item() == ctx.grad_scale:
            return grad, None, None, None
        # In fp32: a GradScaler's factor (2 ** 16) is already infinite in fp16.
        return (grad.float() * (grad_total / ctx.grad_scale)).to(grad.dtype), None, None, None


def summed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, smoothing: float,
                         grad_scale: float = 1.0) -> torch.Tensor:
    """The summed label-smoothed cross entropy of (rows, vocab) logits, computed in fp32 whatever their dtype.
    `grad_scale`: the factor the caller scales it by before backward (on CPUs the gradient is made scaled)."""
    if logits.device.type == "cpu":
        return SmoothedCrossEntropy.apply(logits, target, smoothing, grad_scale)
    return F.cross_entropy(logits.float(), target, label_smoothing=smoothing, reduction="sum")


class TokenLoss(torch.nn.Module):
    """The model with its training objective as its forward: the summed loss of a batch's real target tokens."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        bias = getattr(model, "final_logits_bias", None)
        # Read once: the bias is a buffer no update touches (a resumed checkpoint holds the same values).
        self.adds_logits_bias = bias is not None and bool(bias.any())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder_input_ids: torch.Tensor,
                labels: torch.Tensor, target_positions: torch.Tensor, label_smoothing: float = 0.0,
                grad_scale: float = 1.0) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                       decoder_input_ids=decoder_input_ids, use_cache=False).last_hidden_state
        real = hidden.reshape(-1, hidden.size(-1)).index_select(0, target_positions)
        logits = self.model.get_output_embeddings()(real)
        if self.adds_logits_bias:
            logits = logits.float() + self.model.final_logits_bias[0]
        return summed_cross_entropy(logits, labels.reshape(-1).index_select(0, target_positions), label_smoothing,
                                    grad_scale)
