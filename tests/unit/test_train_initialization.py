"""model.weight_init: xavier draws a scratch model's weights as Vaswani et al. and fairseq do; normal keeps
transformers' N(0, 0.02). Checked on the real MarianMTModel the training stage builds."""

from __future__ import annotations

import math

import pytest

from pipeline.params import ParamsError, parse
from stages.train.model import build_model, model_spec

torch = pytest.importorskip("torch")

VOCAB, PAD, EOS = 4001, 0, 2
SHAPE = {"preset": "tiny", "d_model": 64, "ffn_dim": 256, "encoder_layers": 2, "decoder_layers": 2}


def built(weight_init: str, seed: int = 1, **model) -> torch.nn.Module:
    params = parse({"model": {**SHAPE, "weight_init": weight_init, **model}})
    return build_model(params.model, VOCAB, PAD, EOS, seed=seed)


def xavier_std(weight: torch.Tensor, gain: float = 1.0) -> float:
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_xavier_draws_embeddings_at_d_model_to_the_minus_half_and_projections_xavier_uniform():
    model = built("xavier")
    embedding = model.get_input_embeddings().weight
    assert embedding[1:].std().item() == pytest.approx(64 ** -0.5, rel=0.02)
    assert embedding[PAD].abs().max().item() == 0.0
    assert model.lm_head.weight is embedding, "the tied output projection is the embedding, drawn once"
    layer = model.model.encoder.layers[0]
    for name in ("q_proj", "k_proj", "v_proj"):
        weight = getattr(layer.self_attn, name).weight
        assert weight.std().item() == pytest.approx(xavier_std(weight, 2 ** -0.5), rel=0.05)
        assert weight.abs().max().item() <= math.sqrt(3) * xavier_std(weight, 2 ** -0.5) + 1e-6  # uniform
    for weight in (layer.self_attn.out_proj.weight, layer.fc1.weight, layer.fc2.weight,
                   model.model.decoder.layers[1].encoder_attn.out_proj.weight):
        assert weight.std().item() == pytest.approx(xavier_std(weight), rel=0.05)
    biases = [m.bias for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert biases and all(b.abs().max().item() == 0.0 for b in biases)


def test_xavier_leaves_positions_and_norms_as_transformers_draws_them():
    xavier, normal = built("xavier"), built("normal")
    for side in ("encoder", "decoder"):
        positions = getattr(xavier.model, side).embed_positions.weight
        assert torch.equal(positions, getattr(normal.model, side).embed_positions.weight)
        assert positions.abs().max().item() > 0.99  # sinusoids, not redrawn
    norms = [m for m in xavier.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(torch.all(m.weight == 1) and torch.all(m.bias == 0) for m in norms)


def test_normal_is_transformers_own_and_an_untied_output_is_drawn_as_an_embedding():
    normal = built("normal")
    assert normal.get_input_embeddings().weight[1:].std().item() == pytest.approx(0.02, rel=0.02)
    assert normal.model.encoder.layers[0].fc1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    untied = built("xavier", tie_embeddings=False)
    assert untied.lm_head.weight is not untied.get_input_embeddings().weight
    assert untied.lm_head.weight.std().item() == pytest.approx(64 ** -0.5, rel=0.02)


def test_the_draw_depends_on_the_seed_alone_and_leaves_the_callers_random_state():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    first, again, other = built("xavier"), built("xavier"), built("xavier", seed=2)
    assert torch.equal(torch.get_rng_state(), before)
    for a, b in zip(first.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.model.encoder.layers[0].fc1.weight, other.model.encoder.layers[0].fc1.weight)


def test_a_spec_saved_before_the_option_builds_transformers_draw():
    spec = model_spec(parse({"model": SHAPE}).model)
    assert spec.pop("weight_init") == "normal"
    old, normal = build_model(spec, VOCAB, PAD, EOS), built("normal")
    assert torch.equal(old.model.encoder.layers[0].fc1.weight, normal.model.encoder.layers[0].fc1.weight)


def test_a_pretrained_model_keeps_its_weights_so_asking_to_redraw_them_is_refused():
    with pytest.raises(ParamsError, match="weight_init 'xavier' draws a model trained from scratch"):
        parse({"model": {"init": "pretrained", "name_or_path": "Helsinki-NLP/opus-mt-en-de", "weight_init": "xavier"}})
