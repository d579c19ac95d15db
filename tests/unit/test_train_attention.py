"""The attention kernel a training run computes with: eager on a CPU (SDPA's flash backward is slow there), SDPA
on a GPU; the same function either way, and nothing of the choice is saved with the model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from transformers import MarianConfig, MarianMTModel

from stages.train.model import training_attention


def tiny_marian() -> MarianMTModel:
    config = MarianConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=1,
                          decoder_start_token_id=1, eos_token_id=2, dropout=0.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return MarianMTModel(config)


def loss_and_grads(model: MarianMTModel) -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 64, (4, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[:2, 5:] = 0  # padded rows: the mask must mean the same to both kernels
    labels = torch.randint(3, 64, (4, 6), generator=generator)
    model.zero_grad()
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_a_cpu_run_trains_with_eager_attention_and_a_gpu_run_with_sdpa():
    model = tiny_marian()
    assert training_attention(model, torch.device("cpu")) == "eager"
    assert model.config._attn_implementation == "eager"
    assert training_attention(model, SimpleNamespace(type="cuda")) == "sdpa"
    assert model.config._attn_implementation == "sdpa"


def test_eager_attention_computes_the_loss_and_gradients_sdpa_does():
    model = tiny_marian()
    sdpa_loss, sdpa_grads = loss_and_grads(model)
    training_attention(model, torch.device("cpu"))
    eager_loss, eager_grads = loss_and_grads(model)
    assert torch.allclose(eager_loss, sdpa_loss, atol=1e-6)
    assert all(torch.allclose(e, s, atol=1e-6) for e, s in zip(eager_grads, sdpa_grads, strict=True))


def test_the_saved_model_does_not_record_the_training_kernel(tmp_path):
    model = tiny_marian()
    training_attention(model, torch.device("cpu"))
    model.save_pretrained(tmp_path)
    assert not [key for key in json.loads((tmp_path / "config.json").read_text()) if "attn" in key]


def test_attention_and_activation_dropout_reach_the_model_and_drop_under_the_cpu_dropout():
    from pipeline.params import parse
    from stages.train.dropout import training_dropout
    from stages.train.model import build_model

    def model_with(**fields: float) -> MarianMTModel:
        spec = parse({"model": {"preset": "tiny", "dropout": 0.0, **fields}}).model
        model = build_model(spec, vocab_size=64, pad_id=1, eos_id=2)
        training_attention(model, torch.device("cpu"))
        return model.train()

    def two_training_losses(model: MarianMTModel) -> tuple[float, float]:
        with training_dropout(torch.device("cpu")):
            return loss_and_grads(model)[0].item(), loss_and_grads(model)[0].item()

    plain = model_with()
    assert plain.config.attention_dropout == 0.0 and plain.config.activation_dropout == 0.0
    first, second = two_training_losses(plain)
    assert first == second  # no dropout anywhere: training forwards repeat
    for field in ("attention_dropout", "activation_dropout"):
        model = model_with(**{field: 0.3})
        assert getattr(model.config, field) == 0.3
        first, second = two_training_losses(model)
        assert first != second, f"{field} drew no masks"


def test_the_ffn_activation_reaches_the_model_and_its_saved_config():
    from pipeline.params import parse
    from stages.train.model import build_model

    def model_with(**fields: str) -> MarianMTModel:
        spec = parse({"model": {"preset": "tiny", "dropout": 0.0, **fields}}).model
        return build_model(spec, vocab_size=64, pad_id=1, eos_id=2)

    assert model_with().config.activation_function == "relu"  # every preset's
    losses = {}
    for name in ("relu", "gelu", "swish"):
        model = model_with(activation=name)
        assert model.config.activation_function == name
        torch.manual_seed(0)
        model = model_with(activation=name)
        losses[name] = loss_and_grads(model)[0].item()
    assert len(set(losses.values())) == 3  # the same draw computes three different functions


def test_an_unknown_activation_is_refused_by_name():
    import pytest

    from pipeline.params import ParamsError, parse

    with pytest.raises(ParamsError, match="model.activation = 'tanh'"):
        parse({"model": {"preset": "tiny", "activation": "tanh"}})


def test_a_pretrained_model_refuses_an_activation_of_its_own():
    import pytest

    from pipeline.params import ParamsError, parse

    with pytest.raises(ParamsError, match="computes its own"):
        parse({"model": {"init": "pretrained", "name_or_path": "ckpt/opus-mt-en-de", "activation": "swish"}})
