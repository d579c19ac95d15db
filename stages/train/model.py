"""Build a transformers Marian encoder-decoder from the model params, or load a pretrained one; what trains.

Marian is the transformers architecture of Opus-MT: a post-norm Transformer (Vaswani et al. 2017) with
sinusoidal positions, scaled and shared embeddings, and generation (beam search) built in. Attention runs
through PyTorch SDPA on GPUs, and through transformers' eager attention (matmul, softmax, matmul) when training
on a CPU (`training_attention`). Imports only torch, transformers and the stdlib-only pipeline.runtime.families.

A pretrained checkpoint (`model.init: pretrained`) must be of one of the families the pipeline exports
(pipeline/runtime/families.py: Marian/OPUS-MT, mBART, mBART-50, M2M-100, NLLB). The tokenize stage worked its family
out and recorded it in languages.json; the model loaded must be of that family's architecture.

What trains (the `train:` params, applied by the loop): `gradient_checkpointing` recomputes each layer's
activations in the backward pass instead of keeping them (transformers' own per-layer checkpointing,
non-reentrant, so frozen embeddings do not cut the gradient off from the layers above them). `freeze` keeps
parameters fixed: they take no gradient, so AdamW (which skips a parameter without one: no step, no weight
decay, no moments) leaves them as they are:
  - embeddings: the token embeddings (the matrix encoder and decoder share, or each side's when they do not),
    the output projection where it is tied to them (an untied one trains), and learned position embeddings
    (mBART's; Marian's and M2M-100's sinusoidal ones are fixed anyway). mBART's layernorm_embedding trains. This
    is what fine-tuning recipes call freezing the embeddings (transformers' former seq2seq `freeze_embeds`).
  - encoder: every parameter the encoder computes with, so the encoder stays the same function. With the token
    embeddings shared by encoder and decoder (all five families' checkpoints), that includes them: freezing
    the encoder then also fixes the decoder's token embeddings and the tied output projection.

A Marian model's <pad> embedding rows, which its decoder starts from, stay at zero (`zero_start_rows`; the loop
zeroes them after every optimizer step), whether built here or pretrained: CTranslate2 starts Marian's decoder from
a zero vector in their place. A pretrained checkpoint whose row is not zero has it zeroed before training (the
loop warns): its outputs change, but CTranslate2 could not reproduce it as it is, and fine-tuning adapts.

The model settings arrive as `pipeline.params.ModelParams` or as the plain dict `model_spec` makes of it (what
the torchrun workers and the GPU benchmark get: they must not need pydantic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import Family


def model_spec(model: Any) -> dict[str, Any]:
    """The model settings as plain JSON-able data: `ModelParams` (or an already plain dict) -> dict."""
    if isinstance(model, dict):
        return model
    return {
        "init": model.init,
        "name_or_path": model.name_or_path,
        "arch": model.architecture(),
        "tie_embeddings": model.tie_embeddings,
        "weight_init": model.weight_init,
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
        attention_dropout=arch.get("attention_dropout", 0.0),  # a spec saved before these existed has neither
        activation_dropout=arch.get("activation_dropout", 0.0),
        activation_function=arch.get("activation", "relu"),
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
    model: Any, vocab_size: int, pad_id: int, eos_id: int, seed: int = 1, joint_vocab: bool = True,
    family: Family | None = None,
) -> Any:
    """A freshly initialised model (init: scratch) or the checkpoint at model.name_or_path (init: pretrained).

    A pretrained checkpoint must be of the family the data was tokenized for (`family`: languages.json's, which the
    tokenize stage worked out from this checkpoint), by its architecture, with an embedding row for every id of the
    data's vocabulary.

    The initial weights come from `seed` alone, drawn inside a forked random state: the caller's torch random
    state is the same after the call as before, so every DDP rank builds the same weights and keeps the dropout
    stream it seeded for itself."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, MarianMTModel

    model = model_spec(model)
    if model["init"] == "pretrained":
        loaded = AutoModelForSeq2SeqLM.from_pretrained(model["name_or_path"], attn_implementation="sdpa")
        if family is not None and loaded.config.model_type != family.model_type:
            raise PipelineError(f"model.name_or_path {model['name_or_path']} is a {loaded.config.model_type} model, "
                                f"but data/tokenized was tokenized for a {family.name} checkpoint (model_type "
                                f"{family.model_type}, hf_tokenizer/languages.json): run `dvc repro tokenize`")
        rows = loaded.get_input_embeddings().num_embeddings
        if rows < vocab_size:
            raise PipelineError(f"model.name_or_path {model['name_or_path']}: its embeddings have {rows} rows, but "
                                f"the tokenized data's vocabulary has {vocab_size} ids (data/tokenized/meta.json): "
                                "it was tokenized for another checkpoint; run `dvc repro tokenize`")
        return loaded
    config = marian_config(model, vocab_size, pad_id, eos_id, joint_vocab)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):  # the model is built on the CPU: only the CPU generator is drawn
        torch.manual_seed(seed)
        built = MarianMTModel(config)
        if model.get("weight_init", "normal") == "xavier":  # a spec saved before the option was transformers'
            from stages.train.initialization import xavier_init

            xavier_init(built)
    built.generation_config = generation_config(pad_id, eos_id, model["max_positions"])
    return built


def training_attention(model: Any, device: Any) -> str:
    """Set the attention kernel a training run computes with on `device`; returns its name.

    On CPUs, SDPA's flash kernel has a slow backward pass: profiled on the cpu-ref model (bf16, 2 threads, 20
    updates of Multi30k batches), its backward alone took 23% of an update, ten times its forward. Eager attention
    (transformers' matmul-softmax-matmul, which autograd differentiates with plain matmuls) trains the same model
    1.24x faster in bf16 (bench/train_throughput.py: 3702 against 2986 target tok/s), and SDPA's math kernel
    1.13x. On GPUs SDPA (flash or memory-efficient) stays. The weights and the saved checkpoint do not depend on
    the choice: evaluate and export load it with their own."""
    implementation = "eager" if device.type == "cpu" else "sdpa"
    model.set_attn_implementation(implementation)
    return implementation


def pad_embedding_rows(model: Any, pad_id: int) -> list[Any]:
    """The <pad> rows of every distinct embedding matrix (one when shared, two with separate vocabularies)."""
    matrices = {id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_decoder().embed_tokens)}
    return [w.data[pad_id] for w in matrices.values()]


def zero_start_rows(model: Any, pad_id: int) -> list[Any]:
    """The embedding rows the trainer keeps at zero, after every optimizer step: a Marian model's <pad> rows
    (pad_embedding_rows), whether built here or pretrained; none for the other families.

    Marian decodes from <pad>, and the row is zero in Marian itself and in every converted OPUS-MT checkpoint
    (transformers' converter appends <pad> as a zero row); CTranslate2's Marian converter drops the row and starts
    the decoder from a zero vector. A trained row (tied, hence non-zero) would make the converted model translate
    differently. mBART, M2M-100 and NLLB decode from </s> or a language code, rows CTranslate2 keeps as trained."""
    if model.config.model_type != "marian":
        return []
    return pad_embedding_rows(model, pad_id)


def zero_rows(rows: Iterable[Any]) -> float:
    """Zero `rows` in place; returns the largest norm one had (0.0 when all were zero already)."""
    import torch

    largest = 0.0
    with torch.no_grad():
        for row in rows:
            largest = max(largest, float(row.norm()))
            row.zero_()
    return largest


def count_parameters(model: Any, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def frozen_parameters(model: Any, parts: Iterable[str]) -> list[Any]:
    """The distinct parameters `train.freeze` names (see the module docstring for what each part holds)."""
    chosen: dict[int, Any] = {}
    for part in parts:
        if part == "embeddings":
            modules = [model.get_input_embeddings(), model.get_encoder().embed_tokens,
                       model.get_decoder().embed_tokens]
            modules += [getattr(side, "embed_positions", None) for side in (model.get_encoder(), model.get_decoder())]
            params = [p for m in modules if m is not None for p in m.parameters()]
            output = model.get_output_embeddings()
            if output is not None and any(output.weight is p for p in params):  # tied: the same matrix
                params.append(output.weight)
        elif part == "encoder":
            params = list(model.get_encoder().parameters())
        else:
            raise ValueError(f"train.freeze: unknown part {part!r} (embeddings, encoder)")
        chosen.update((id(p), p) for p in params)
    return list(chosen.values())


def freeze(model: Any, parts: Iterable[str]) -> None:
    """Keep the parameters of `parts` fixed: they take no gradient (count_parameters(trainable_only) leaves them
    out)."""
    for p in frozen_parameters(model, parts):
        p.requires_grad_(False)


def enable_gradient_checkpointing(model: Any,
                                  recompute_dropout: Callable[[], AbstractContextManager] | None = None) -> None:
    """Recompute each layer's activations in backward (only while the model is in training mode).

    Non-reentrant checkpointing: the reentrant kind gives no gradient to a checkpointed layer whose inputs need
    none, which frozen embeddings would cause. It restores the random state before recomputing, so the dropout
    masks are the forward's provided the recomputation draws them the same way: `recompute_dropout` is the block
    the training forward runs its dropout in (dropout.py), opened around each recomputation. The loop's CPU
    dropout is a function mode, which does not reach into backward: without the block a CPU recomputation would
    draw PyTorch's own masks, and torch's checkpoint stops with a CheckpointError. transformers 5 renames the
    method (activation_checkpointing_enable); the GPU image's version may have only the old name."""
    from contextlib import nullcontext

    kwargs: dict[str, Any] = {"use_reentrant": False}
    if recompute_dropout is not None:
        kwargs["context_fn"] = lambda: (nullcontext(), recompute_dropout())
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable(kwargs)
