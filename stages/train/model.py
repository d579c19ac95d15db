"""Build a transformers Marian encoder-decoder from the model params, or load a pretrained one.

Marian is the transformers architecture of Opus-MT: a post-norm Transformer (Vaswani et al. 2017) with
sinusoidal positions, scaled and shared embeddings, and generation (beam search) built in. Attention runs
through PyTorch SDPA. Imports only torch and transformers.

The model settings arrive as `pipeline.params.ModelParams` or as the plain dict `model_spec` makes of it (what
the torchrun workers and the GPU benchmark get: they must not need pydantic).
"""

from __future__ import annotations

from typing import Any


def model_spec(model: Any) -> dict[str, Any]:
    """The model settings as plain JSON-able data: `ModelParams` (or an already plain dict) -> dict."""
    if isinstance(model, dict):
        return model
    return {
        "init": model.init,
        "name_or_path": model.name_or_path,
        "arch": model.architecture(),
        "tie_embeddings": model.tie_embeddings,
        "max_positions": model.max_positions,
    }


def marian_config(model: Any, vocab_size: int, pad_id: int, eos_id: int, joint_vocab: bool = True) -> Any:
    from transformers import MarianConfig

    model = model_spec(model)
    arch = model["arch"]
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=arch["d_model"],
        encoder_layers=arch["encoder_layers"],
        decoder_layers=arch["decoder_layers"],
        encoder_attention_heads=arch["attention_heads"],
        decoder_attention_heads=arch["attention_heads"],
        encoder_ffn_dim=arch["ffn_dim"],
        decoder_ffn_dim=arch["ffn_dim"],
        dropout=arch["dropout"],
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="relu",
        max_position_embeddings=model["max_positions"],
        scale_embedding=True,
        # A joint vocabulary shares one embedding matrix between encoder, decoder (and output, when tied).
        share_encoder_decoder_embeddings=joint_vocab,
        tie_word_embeddings=model["tie_embeddings"],
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        decoder_start_token_id=pad_id,
    )


def generation_config(pad_id: int, eos_id: int, max_length: int) -> Any:
    """Saved with the model (transformers 5 keeps generation settings only in generation_config.json)."""
    from transformers import GenerationConfig

    # Marian starts decoding from <pad>; generation must never emit <pad> itself.
    return GenerationConfig(
        decoder_start_token_id=pad_id,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        forced_eos_token_id=eos_id,
        bad_words_ids=[[pad_id]],
        num_beams=4,
        max_length=max_length,
    )


def build_model(
    model: Any, vocab_size: int, pad_id: int, eos_id: int, seed: int = 1, joint_vocab: bool = True
) -> Any:
    """A freshly initialised model (init: scratch) or the checkpoint at model.name_or_path (init: pretrained).

    The initial weights come from `seed` alone, drawn inside a forked random state: the caller's torch random
    state is the same after the call as before, so every DDP rank builds the same weights and keeps the dropout
    stream it seeded for itself."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, MarianMTModel

    model = model_spec(model)
    if model["init"] == "pretrained":
        return AutoModelForSeq2SeqLM.from_pretrained(model["name_or_path"], attn_implementation="sdpa")
    config = marian_config(model, vocab_size, pad_id, eos_id, joint_vocab)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):  # the model is built on the CPU: only the CPU generator is drawn
        torch.manual_seed(seed)
        built = MarianMTModel(config)
    built.generation_config = generation_config(pad_id, eos_id, model["max_positions"])
    return built


def pad_embedding_rows(model: Any, pad_id: int) -> list[Any]:
    """The <pad> rows of every distinct embedding matrix (one when shared, two with separate vocabularies).

    The trainer keeps them at zero: Marian decoding starts from the <pad> embedding, and CTranslate2's converter
    assumes a zero start vector, so a trained (tied, hence non-zero) row would make the converted model differ.
    """
    matrices = {id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_decoder().embed_tokens)}
    return [w.data[pad_id] for w in matrices.values()]


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
