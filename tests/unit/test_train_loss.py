"""The training objective: the hand-written label-smoothed cross entropy is PyTorch's, value and gradient, in fp32
and from bf16 logits, with and without autograd; TokenLoss (the real target rows only, the logits bias only where
it is set) is the loss the family's own model computes from its labels, for Marian, mBART and M2M-100."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import (
    M2M100Config,
    M2M100ForConditionalGeneration,
    MBartConfig,
    MBartForConditionalGeneration,
)

from stages.train import loss as loss_module
from stages.train.batching import IGNORE_INDEX, Batch
from stages.train.loss import SmoothedCrossEntropy, TokenLoss
from tests.support.tiny_models import tiny_marian


def reference(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target, label_smoothing=smoothing, reduction="sum")


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("rows", [1, 7, 300])  # one chunk, a part of one, several with a remainder
def test_the_smoothed_cross_entropy_is_pytorch_s_in_value_and_gradient(smoothing, rows, monkeypatch):
    monkeypatch.setattr(loss_module, "CPU_CHUNK_ELEMENTS", 64 * 97)  # 64 rows a chunk at this vocabulary
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, 97, generator=generator) * 4).requires_grad_()
    target = torch.randint(0, 97, (rows,), generator=generator)
    ours = SmoothedCrossEntropy.apply(logits, target, smoothing)
    (ours * 0.5).backward()
    grad = logits.grad.clone()
    logits.grad = None
    theirs = reference(logits, target, smoothing)
    (theirs * 0.5).backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, logits.grad, rtol=1e-5, atol=1e-6)


def test_from_bf16_logits_it_computes_in_fp32_and_returns_a_bf16_gradient():
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(130, 8001, generator=generator) * 3).bfloat16().requires_grad_()
    target = torch.randint(0, 8001, (130,), generator=generator)
    scale = 1 / 130  # the loop scales the summed loss by 1 / the update's target tokens, and says so to the loss
    ours = SmoothedCrossEntropy.apply(logits, target, 0.1, scale)
    (ours * scale).backward()
    grad = logits.grad.clone()
    logits.grad = None
    theirs = reference(logits, target, 0.1)  # PyTorch on the same values, cast to fp32
    (theirs * scale).backward()
    assert ours.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-3)
    # Both round the scaled fp32 gradient to bf16 once: at most one bf16 step apart.
    torch.testing.assert_close(grad.float(), logits.grad.float(), rtol=2 ** -7, atol=1e-8)
    # Scaled by another factor than it was told, the loss rescales its gradient (rounding it twice).
    logits.grad = None
    (SmoothedCrossEntropy.apply(logits, target, 0.1, 1.0) * scale).backward()
    torch.testing.assert_close(logits.grad.float(), grad.float(), rtol=2 ** -6, atol=1e-8)


def test_without_autograd_it_computes_the_same_loss_and_keeps_no_gradient():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(50, 97, generator=generator) * 4
    target = torch.randint(0, 97, (50,), generator=generator)
    with torch.no_grad():
        plain = SmoothedCrossEntropy.apply(logits, target, 0.1)
    assert not plain.requires_grad and plain.grad_fn is None
    trained = SmoothedCrossEntropy.apply(logits.clone().requires_grad_(), target, 0.1)
    assert plain.item() == trained.item()


def tiny(config_class, model_class):
    """A one-layer model of the family, built with its own classes (pad 1, as mBART and M2M-100 have it)."""
    torch.manual_seed(0)
    return model_class(config_class(vocab_size=61, d_model=16, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                    decoder_ffn_dim=32, pad_token_id=1, dropout=0.0))


@pytest.mark.parametrize("build", [lambda: tiny_marian(False), lambda: tiny_marian(True),
                                   lambda: tiny(MBartConfig, MBartForConditionalGeneration),
                                   lambda: tiny(M2M100Config, M2M100ForConditionalGeneration)],
                         ids=["marian", "marian-with-bias", "mbart", "m2m100"])
def test_token_loss_is_the_family_s_own_loss_over_the_real_target_tokens(build):
    model = build().eval()
    generator = np.random.default_rng(2)
    labels = generator.integers(3, 58, (4, 6))
    labels[0, 4:] = labels[2, 2:] = IGNORE_INDEX  # padding: no row of the loss
    decoder_input_ids = np.where(labels == IGNORE_INDEX, 1, labels)
    input_ids = generator.integers(3, 58, (4, 5))
    mask = np.ones_like(input_ids)
    mask[1, 3:] = 0
    batch = Batch(input_ids, mask, decoder_input_ids, labels, src_tokens=int(mask.sum()),
                  tgt_tokens=int((labels != IGNORE_INDEX).sum()))
    inputs = {name: torch.from_numpy(a) for name, a in batch.arrays().items()}
    assert inputs["target_positions"].tolist() == np.flatnonzero(labels.reshape(-1) != IGNORE_INDEX).tolist()
    with torch.no_grad():
        ours = TokenLoss(model)(**inputs, label_smoothing=0.0)
        own = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                    decoder_input_ids=inputs["decoder_input_ids"], labels=inputs["labels"]).loss
    torch.testing.assert_close(ours / batch.tgt_tokens, own, rtol=1e-5, atol=1e-6)
