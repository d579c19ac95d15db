"""train.weight_decay: AdamW's decoupled decay shrinks the weight matrices and leaves biases and LayerNorm gains."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from stages.train.loop import _optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))


def _step_without_gradient_signal(model: torch.nn.Module, weight_decay: float,
                                  ) -> tuple[dict[str, torch.Tensor], torch.optim.Optimizer]:
    """One update whose gradients are all zero (none for frozen weights, as in training): whatever moves, moves by
    the decay alone."""
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = _optimizer(model, SimpleNamespace(lr=0.1, weight_decay=weight_decay))
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    optimizer.step()
    return before, optimizer


def test_decay_shrinks_matrices_by_lr_times_decay_and_leaves_biases_and_norm_gains():
    model = _model()
    before, _ = _step_without_gradient_signal(model, weight_decay=0.5)
    after = dict(model.named_parameters())
    for name in ("0.weight", "1.weight"):  # embedding, projection
        torch.testing.assert_close(after[name].detach(), before[name] * (1 - 0.1 * 0.5))
    for name in ("1.bias", "2.weight", "2.bias"):
        torch.testing.assert_close(after[name].detach(), before[name], rtol=0, atol=0)


def test_without_decay_one_group_holds_every_parameter_and_nothing_moves():
    model = _model()
    before, optimizer = _step_without_gradient_signal(model, weight_decay=0.0)
    assert len(optimizer.param_groups) == 1
    assert len(optimizer.param_groups[0]["params"]) == len(list(model.parameters()))
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)


def test_a_marian_model_decays_its_matrices_and_keeps_norms_biases_and_sinusoidal_positions():
    """transformers' own MarianMTModel, as the training stage builds or loads it: its positions are a frozen
    sinusoid table (no gradient, so no decay either) and its final_logits_bias a buffer."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(vocab_size=32, d_model=16, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                       decoder_ffn_dim=32, max_position_embeddings=16, pad_token_id=31,
                                       decoder_start_token_id=31))
    before, _ = _step_without_gradient_signal(model, weight_decay=0.5)
    after = dict(model.named_parameters())
    moved = {name for name, p in after.items() if not torch.equal(p.detach(), before[name])}
    assert "model.shared.weight" in moved and "model.encoder.layers.0.fc1.weight" in moved
    assert not any(name.endswith((".bias", "layer_norm.weight")) for name in moved), sorted(moved)
    assert not any("embed_positions" in name for name in moved), sorted(moved)
