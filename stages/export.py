"""export: the trained model as ONNX graphs with a KV cache (plus int8, legacy TorchScript and CTranslate2 options),
gated by a parity check against PyTorch.

ONNX (`export.onnx`), the format `mtpipe translate` runs (see pipeline/translate.py for the runtime):

    encoder.onnx  input_ids, attention_mask -> last_hidden_state, cross_key_0, cross_value_0, ...
    decoder.onnx  decoder_input_ids, encoder_attention_mask, cache_rows, self_key_0, self_value_0, ...,
                  cross_key_0, ... -> logits, next_log_probs, next_ids, present_self_key_0, present_self_value_0, ...

Caches are one (rows, heads, length, head_dim) tensor per layer and kind: stacking them would make the graph split
and re-stack the whole cache at every step. The encoder computes every decoder layer's cross-attention keys and
values once per sentence, and they stay per sentence: the decoder's rows are sentences x beams, and a sentence's
beams attend to its keys together. The decoder appends the new tokens' self-attention keys and values to the ones
it is given, so a step costs O(length) instead of re-running the prefix; `cache_rows` names the row of the given
cache each row continues from, so beam search reorders hypotheses without copying caches itself. It also returns
each row's best 2 x evaluate.beam + 1 next tokens with their log-softmax (what a beam of that width needs), so beam
search does not sort the vocabulary in numpy; a wider beam at translation time takes them from the logits instead,
more slowly.

The cached decoder is a small module written here over the model's own layers (projections, layer norms,
feed-forward), not transformers' Cache objects (whose argument was renamed from `past_key_values` to `cache` in
transformers 5): its inputs and outputs are plain tensors, which exports cleanly and does not move with that API.
Sentences, rows, source length, cache length and new-token length are all dynamic
(`torch.onnx.export(dynamo=True, dynamic_shapes=...)`).

Options: `export.int8` adds `encoder.int8.onnx`/`decoder.int8.onnx` (onnxruntime dynamic quantisation: every
MatMul with a weight, the output projection included, runs in int8 with activations quantised per call; the
embedding lookups stay fp32); `export.torchscript` traces the encoder and an uncached decoder (legacy: torch
deprecates TorchScript); `export.ctranslate2` converts the model to a CTranslate2 directory
(`pip install mtpipe[ct2]`). `models/export` also gets the tokenizer files, config.json, generation_config.json and
an `export.json` manifest, so it is self-contained.

The parity gate runs on the first `export.parity_sentences` pairs of the first test split, against the model as
PyTorch runs it, and fails the stage (`ParityFailed`, nothing published) unless
  - every fp32 graph's outputs are within `export.max_logit_diff` (max abs) of PyTorch: encoder states and cross
    caches, teacher-forced decoder logits fed the whole prefix at once, the same fed one token at a time through the
    cache, and end to end (ONNX encoder into ONNX decoder);
  - greedy decoding with ONNX Runtime through the cache gives token-identical output to `model.generate` for at
    least `export.min_identical` of the sentences, never emits <pad>, and its corpus BLEU is within
    `export.max_bleu_delta` of PyTorch's.
The int8 graphs and CTranslate2 are reported (identical share, BLEU and its delta), not gated: quantisation is
expected to change some outputs. Figures go to `metrics/export.json`.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import Paths, atomic_path, test_splits, write_json
from pipeline.corpus import read_pairs
from pipeline.errors import MissingArtifact, OptionalDependencyMissing, ParityFailed
from pipeline.params import Params
from pipeline.translate import (
    ENCODER_INPUTS,
    MANIFEST,
    ONNX_FILES,
    ONNX_INT8_FILES,
    OnnxSeq2Seq,
    SpecialIds,
    beam_search,
    candidates_for_beam,
    decoder_inputs,
    decoder_outputs,
    encoder_outputs,
    pad_batch,
    strip_hypothesis,
)

log = logging.getLogger("mtpipe.export")

GRAPHS = ("encoder", "decoder")
TORCHSCRIPT_FILES = {"encoder": "encoder.ts.pt", "decoder": "decoder.ts.pt"}
# The legacy TorchScript graphs have no cache: the decoder takes the whole prefix and the encoder states.
TORCHSCRIPT_INPUTS = {
    "encoder": ["input_ids", "attention_mask"],
    "decoder": ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
}
TORCHSCRIPT_OUTPUTS = {"encoder": ["last_hidden_state"], "decoder": ["logits"]}
CTRANSLATE2_DIR = "ctranslate2"
# Files of models/final that are the PyTorch weights; everything else (tokenizer, configs) is copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")
ORT_THREADS = 2
# Parity sentences are run in batches of this many (padded), which bounds the teacher-forced logits' memory.
PARITY_BATCH = 16
MANIFEST_VERSION = 3


# --------------------------------------------------------------------------------------------------- wrappers


@functools.cache
def _wrapper_classes() -> dict[str, type]:
    """The wrapper classes, defined on first use so that importing this module does not import torch."""
    import torch
    from torch import nn

    def split_heads(states: Any, head_dim: int) -> Any:
        """(batch, length, d_model) -> (batch, heads, length, head_dim)."""
        batch, length, _ = states.shape
        return states.view(batch, length, -1, head_dim).transpose(1, 2)

    def attend(attention: Any, hidden: Any, keys: Any, values: Any, bias: Any, head_dim: int) -> Any:
        """MarianAttention's output for queries from `hidden` over given keys/values, with an additive mask."""
        query = split_heads(attention.q_proj(hidden), head_dim)
        weights = torch.softmax(torch.matmul(query, keys.transpose(2, 3)) * attention.scaling + bias, dim=-1)
        out = torch.matmul(weights, values).transpose(1, 2)
        return attention.out_proj(out.reshape(out.shape[0], out.shape[1], -1))

    def attend_by_sentence(attention: Any, hidden: Any, keys: Any, values: Any, bias: Any, head_dim: int) -> Any:
        """Cross-attention for rows that come in groups per sentence (its beams) over per-sentence keys/values.

        hidden: (sentences * group, new_len, d_model); keys, values: (sentences, heads, src_len, head_dim); bias:
        (sentences, 1, 1, src_len). A sentence's beams share its encoder keys and values, so they are kept once
        per sentence and each sentence's group x new_len queries attend in one matmul: `group` times less cache
        memory and traffic than repeating the keys per beam.
        """
        rows, new_len, _ = hidden.shape
        sentences, heads = keys.shape[0], keys.shape[1]
        query = split_heads(attention.q_proj(hidden), head_dim)  # (rows, heads, new_len, head_dim)
        query = query.reshape(sentences, -1, heads, new_len, head_dim).transpose(1, 2)
        query = query.reshape(sentences, heads, -1, head_dim)  # (sentences, heads, group * new_len, head_dim)
        weights = torch.softmax(torch.matmul(query, keys.transpose(2, 3)) * attention.scaling + bias, dim=-1)
        out = torch.matmul(weights, values).reshape(sentences, heads, -1, new_len, head_dim)
        out = out.permute(0, 2, 3, 1, 4).reshape(rows, new_len, heads * head_dim)
        return attention.out_proj(out)

    class EncoderForExport(nn.Module):
        """input_ids, attention_mask -> last_hidden_state (the legacy TorchScript encoder)."""

        def __init__(self, model: Any):
            super().__init__()
            self.encoder = model.get_encoder()

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class DecoderForExport(nn.Module):
        """decoder_input_ids, encoder_hidden_states, encoder_attention_mask -> logits (no cache; legacy)."""

        def __init__(self, model: Any):
            super().__init__()
            self.decoder = model.get_decoder()
            self.lm_head = model.lm_head
            # Marian adds a bias buffer outside lm_head; MarianMTModel.forward does the same sum.
            self.register_buffer("final_logits_bias", model.final_logits_bias.detach().clone())

        def forward(self, decoder_input_ids: Any, encoder_hidden_states: Any, encoder_attention_mask: Any) -> Any:
            hidden = self.decoder(
                input_ids=decoder_input_ids,
                encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                use_cache=False,
            ).last_hidden_state
            return self.lm_head(hidden) + self.final_logits_bias

    class EncoderWithCrossCache(nn.Module):
        """input_ids, attention_mask -> last_hidden_state, cross_key_0, cross_value_0, cross_key_1, ...

        The cross-attention keys and values depend only on the encoder states, so they are computed here, once
        per sentence, instead of at every decoding step.
        """

        def __init__(self, model: Any):
            super().__init__()
            self.encoder = model.get_encoder()
            self.decoder_layers = model.get_decoder().layers
            self.head_dim = model.config.d_model // model.config.decoder_attention_heads

        def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, ...]:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            cross_cache = []
            for layer in self.decoder_layers:
                cross_cache.append(split_heads(layer.encoder_attn.k_proj(hidden), self.head_dim))
                cross_cache.append(split_heads(layer.encoder_attn.v_proj(hidden), self.head_dim))
            return (hidden, *cross_cache)

    class CachedDecoder(nn.Module):
        """One decoder pass over `new_len` tokens that follow `past_len` cached ones -> logits and extended cache.

        The Marian decoder layer, post-norm, written out over the model's modules: self-attention over
        cache + new tokens (causal), cross-attention over the precomputed encoder keys/values (source padding
        masked), feed-forward. Equal to MarianMTModel's decoder within float rounding (the parity gate checks it).

        Rows are sentences x group: decoder_input_ids and the self cache have a row per hypothesis (sentence s,
        beam b at row s * group + b), encoder_attention_mask and the cross cache a row per sentence; group is
        rows / sentences (1 without beams).
        """

        def __init__(self, model: Any, candidates: int):
            super().__init__()
            decoder = model.get_decoder()
            self.candidates = min(candidates, model.config.vocab_size)
            self.embed_tokens = decoder.embed_tokens
            self.embed_scale = decoder.embed_scale
            self.embed_positions = decoder.embed_positions
            self.layers = decoder.layers
            # The output projection as its own (d_model, vocab) weight, not the embedding matrix it is tied to:
            # a weight used by Gather and, transposed, by MatMul is not quantised for the MatMul (the int8 graph
            # would dequantise the whole matrix at every step), and the MatMul gets it in the layout it reads.
            self.output_projection = nn.Parameter(model.lm_head.weight.detach().t().contiguous(), requires_grad=False)
            self.register_buffer("final_logits_bias", model.final_logits_bias.detach().clone())
            self.head_dim = model.config.d_model // model.config.decoder_attention_heads

        def forward(
            self,
            decoder_input_ids: Any,
            encoder_attention_mask: Any,
            cache_rows: Any,
            self_cache: list[Any],
            cross_cache: list[Any],
        ) -> tuple[Any, ...]:
            """cache_rows: (rows,) the row of self_cache each row continues from (a beam search's reordering);
            self_cache/cross_cache: [key_0, value_0, key_1, ...] -> logits, next_log_probs, next_ids, *present."""
            past_len, new_len = self_cache[0].shape[2], decoder_input_ids.shape[1]
            positions = torch.arange(new_len, device=decoder_input_ids.device) + past_len
            hidden = self.embed_tokens(decoder_input_ids) * self.embed_scale
            hidden = hidden + self.embed_positions.weight[positions]
            lowest = torch.finfo(hidden.dtype).min
            # New token i (at position past_len + i) sees cached and new tokens up to its own position.
            key_positions = torch.arange(past_len + new_len, device=decoder_input_ids.device)
            future = key_positions[None, :] > positions[:, None]
            self_bias = torch.zeros(future.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(future, lowest)
            cross_bias = (1.0 - encoder_attention_mask[:, None, None, :].to(hidden.dtype)) * lowest

            present = []
            for i, layer in enumerate(self.layers):
                attention = layer.self_attn
                past_keys, past_values = (self_cache[2 * i + j].index_select(0, cache_rows) for j in (0, 1))
                keys = torch.cat([past_keys, split_heads(attention.k_proj(hidden), self.head_dim)], dim=2)
                values = torch.cat([past_values, split_heads(attention.v_proj(hidden), self.head_dim)], dim=2)
                present += [keys, values]
                hidden = layer.self_attn_layer_norm(
                    hidden + attend(attention, hidden, keys, values, self_bias, self.head_dim)
                )
                hidden = layer.encoder_attn_layer_norm(
                    hidden + attend_by_sentence(layer.encoder_attn, hidden, cross_cache[2 * i],
                                                cross_cache[2 * i + 1], cross_bias, self.head_dim)
                )
                hidden = layer.final_layer_norm(hidden + layer.fc2(layer.activation_fn(layer.fc1(hidden))))
            logits = torch.matmul(hidden, self.output_projection) + self.final_logits_bias
            # The scores transformers' beam search uses: log-softmax over the whole vocabulary (<pad> included).
            # Ranked at every position and the last one's kept: a search step feeds one position, and picking it
            # out of the logits first would copy them (ONNX Gather) at every step.
            next_log_probs, next_ids = torch.topk(torch.log_softmax(logits, dim=-1), self.candidates, dim=-1)
            next_log_probs, next_ids = next_log_probs[:, -1], next_ids[:, -1]
            return (logits, next_log_probs, next_ids, *present)

    return {
        "EncoderForExport": EncoderForExport,
        "DecoderForExport": DecoderForExport,
        "EncoderWithCrossCache": EncoderWithCrossCache,
        "CachedDecoder": CachedDecoder,
    }


def __getattr__(name: str) -> Any:
    # `from stages.export import CachedDecoder` works; torch is imported only then.
    if name in ("EncoderForExport", "DecoderForExport", "EncoderWithCrossCache", "CachedDecoder"):
        return _wrapper_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def export_wrappers(model: Any, beam: int = 4) -> tuple[Any, Any]:
    """(EncoderWithCrossCache, CachedDecoder) around a loaded model, in eval mode: the ONNX graphs' modules.

    The decoder returns the next-token candidates a beam of width `beam` needs."""
    classes = _wrapper_classes()
    decoder = classes["CachedDecoder"](model, candidates_for_beam(beam))
    return classes["EncoderWithCrossCache"](model).eval(), decoder.eval()


def legacy_wrappers(model: Any) -> tuple[Any, Any]:
    """(EncoderForExport, DecoderForExport): the uncached modules traced to TorchScript."""
    classes = _wrapper_classes()
    return classes["EncoderForExport"](model).eval(), classes["DecoderForExport"](model).eval()


def empty_cache(model: Any, batch: int) -> list[Any]:
    """Per-layer (batch, heads, 0, head_dim) keys and values: what the first decoding step is given."""
    import torch

    cfg = model.config
    heads = cfg.decoder_attention_heads
    return [torch.zeros(batch, heads, 0, cfg.d_model // heads) for _ in range(2 * cfg.decoder_layers)]


# --------------------------------------------------------------------------------------------------- inputs


def _teacher_forced_inputs(targets: list[list[int]], start_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Decoder inputs (start token + reference minus its last token) and a mask of the real positions."""
    return pad_batch([[start_id, *t[:-1]] for t in targets], pad_id)


def _example_inputs(sources: list[list[int]], targets: list[list[int]], start_id: int, pad_id: int) -> dict:
    """Trace/export inputs: batch 2, lengths >= 2 and padding in every row.

    torch.export specialises dimensions of size 0 or 1, and jit.trace records whichever mask branch the example
    takes, so the example must have a masked position to keep the padding mask in the traced graph.
    """
    import torch

    src = [sources[i % len(sources)] for i in range(2)]
    tgt = [targets[i % len(targets)] for i in range(2)]
    ids, mask = pad_batch(src, pad_id)
    # One more padded column, so that both rows have a masked position.
    ids = np.pad(ids, ((0, 0), (0, 1)), constant_values=pad_id)
    mask = np.pad(mask, ((0, 0), (0, 1)))
    dec_ids, _ = pad_batch([[start_id, *t[:2]] for t in tgt], pad_id)
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "decoder_input_ids": torch.from_numpy(dec_ids),
    }


# --------------------------------------------------------------------------------------------------- export


@contextmanager
def _quiet_export() -> Iterator[None]:
    """Hide warnings that are known and harmless here; the parity gate is what checks the graphs."""
    import torch

    # The ONNX exporter's graph passes log every rewrite at INFO, and torch.onnx warns about torchvision ops.
    chatty = {name: logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")}
    levels = {name: logger.level for name, logger in chatty.items()}
    for logger in chatty.values():
        logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing")
        warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
        try:
            yield
        finally:
            for name, logger in chatty.items():
                logger.setLevel(levels[name])


def export_onnx(model: Any, example: dict, out: Path, opset: int, beam: int) -> dict[str, float]:
    """Write encoder.onnx and decoder.onnx (weights inside, every batch/length dim dynamic); seconds per graph."""
    import onnx
    import torch

    encoder, decoder = export_wrappers(model, beam)
    layers = model.config.decoder_layers
    max_positions = model.config.max_position_embeddings
    batch = torch.export.Dim("batch")  # sentences
    rows = torch.export.Dim("rows")  # hypotheses: sentences x beams
    past_rows = torch.export.Dim("past_rows")  # rows of the cache the hypotheses continue from
    src_len = torch.export.Dim("src_len", max=max_positions)
    past_len = torch.export.Dim("past_len", max=max_positions)
    new_len = torch.export.Dim("new_len", max=max_positions)
    with torch.no_grad():
        _, *cross_cache = encoder(example["input_ids"], example["attention_mask"])
    # 2 sentences x 3 beams continuing from a cache of 4 rows (2 sentences x 2 beams, as after a step that dropped
    # a sentence), 3 tokens long, for 2 new tokens: no dim is 0 or 1, which torch.export would specialise, and
    # rows, cache rows and sentences differ. Every cache tensor must be a distinct object: the exporter merges
    # inputs that are the same tensor into one graph input.
    generator = torch.Generator().manual_seed(0)
    sentences, heads, _, head_dim = cross_cache[0].shape
    group = 3
    decoder_input_ids = example["decoder_input_ids"][:, :2].repeat_interleave(group, dim=0)
    cache_rows = torch.tensor([0, 1, 1, 2, 3, 3])
    self_cache = [torch.randn(4, heads, 3, head_dim, generator=generator) for _ in range(2 * layers)]
    jobs = {
        "encoder": (
            encoder,
            (example["input_ids"], example["attention_mask"]),
            list(ENCODER_INPUTS),
            encoder_outputs(layers),
            {"input_ids": {0: batch, 1: src_len}, "attention_mask": {0: batch, 1: src_len}},
        ),
        "decoder": (
            decoder,
            (decoder_input_ids, example["attention_mask"], cache_rows, self_cache, cross_cache),
            decoder_inputs(layers),
            decoder_outputs(layers),
            {
                "decoder_input_ids": {0: rows, 1: new_len},
                "encoder_attention_mask": {0: batch, 1: src_len},
                "cache_rows": {0: rows},
                "self_cache": [{0: past_rows, 2: past_len}] * (2 * layers),
                "cross_cache": [{0: batch, 2: src_len}] * (2 * layers),
            },
        ),
    }
    seconds = {}
    for graph, (module, args, input_names, output_names, dynamic_shapes) in jobs.items():
        path = out / ONNX_FILES[graph]
        log.info("exporting the %s to ONNX (opset %d)", graph, opset)
        start = time.perf_counter()
        with _quiet_export(), torch.no_grad():
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=True,
                external_data=False,
                opset_version=opset,
                input_names=input_names,
                output_names=output_names,
                dynamic_shapes=dynamic_shapes,
                verbose=False,
            )
        seconds[graph] = round(time.perf_counter() - start, 2)
        onnx.checker.check_model(str(path))
    return seconds


def quantize_int8(out: Path) -> float:
    """encoder.int8.onnx and decoder.int8.onnx: int8 weights (a scale per output column), activations quantised at
    run time; returns seconds.

    MatMuls only: a quantised Gather (the embeddings) would be dequantised in full at every call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    start = time.perf_counter()
    for graph in GRAPHS:
        log.info("quantising the %s to int8 (dynamic)", graph)
        # The quantiser logs every skipped node, and a hint about image-model pre-processing, on the root logger.
        logging.disable(logging.WARNING)
        try:
            # Per output column scales: on the Multi30k cpu-ref model, BLEU 38.59-38.65 across batch budgets
            # against 38.32-38.54 with one scale per matrix (fp32: 38.56), at the same speed.
            quantize_dynamic(out / ONNX_FILES[graph], out / ONNX_INT8_FILES[graph], weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"], per_channel=True)
        finally:
            logging.disable(logging.NOTSET)
    return round(time.perf_counter() - start, 2)


def export_torchscript(model: Any, example: dict, out: Path) -> dict[str, float]:
    """Write encoder.ts.pt and decoder.ts.pt (uncached) with torch.jit.trace; returns seconds per graph."""
    import torch

    log.warning("TorchScript is deprecated in torch (torch.export replaces it); it is kept as a legacy export format")
    encoder, decoder = legacy_wrappers(model)
    with torch.no_grad():
        hidden = encoder(example["input_ids"], example["attention_mask"])
    jobs = {
        "encoder": (encoder, (example["input_ids"], example["attention_mask"])),
        "decoder": (decoder, (example["decoder_input_ids"], hidden, example["attention_mask"])),
    }
    seconds = {}
    for graph, (module, args) in jobs.items():
        log.info("tracing the %s to TorchScript", graph)
        start = time.perf_counter()
        with _quiet_export(), torch.no_grad():
            traced = torch.jit.trace(module, args)
            traced.save(str(out / TORCHSCRIPT_FILES[graph]))
        seconds[graph] = round(time.perf_counter() - start, 2)
    return seconds


def convert_ctranslate2(final_model: Path, out: Path, quantization: str) -> float:
    """A CTranslate2 model directory converted from the save_pretrained directory; returns seconds.

    CTranslate2 drops the last embedding row (<pad>) and starts decoding from a zero vector, which matches the
    trained model because training keeps the <pad> row at zero (see stages/train/loop.py).
    """
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        raise OptionalDependencyMissing(
            "ctranslate2", "export.ctranslate2 is true", "pip install 'mtpipe[ct2]'"
        ) from None
    log.info("converting to CTranslate2 (%s)", quantization)
    start = time.perf_counter()
    TransformersConverter(str(final_model)).convert(str(out), quantization=quantization)
    return round(time.perf_counter() - start, 2)


def copy_model_files(final_model: Path, out: Path) -> list[str]:
    """Copy the tokenizer files, config.json and generation_config.json (everything but the weights)."""
    copied = []
    for f in sorted(final_model.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, out / f.name)
            copied.append(f.name)
    return copied


# --------------------------------------------------------------------------------------------------- parity


def max_new_tokens(params: Params, src_len: int, max_positions: int) -> int:
    """fairseq's max_len_a * src_len + max_len_b, capped so the decoder input stays within the positions."""
    return max(1, min(int(params.evaluate.max_len_a * src_len + params.evaluate.max_len_b), max_positions - 1))


def _max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Max abs difference over the real (unpadded) positions of (batch, length, dim) arrays."""
    keep = mask.astype(bool)
    return float(np.abs(a[keep] - b[keep]).max()) if keep.any() else 0.0


def _max_cache_diff(a: list[np.ndarray], b: list[np.ndarray], mask: np.ndarray) -> float:
    """Max abs difference over the real source positions of per-layer (batch, heads, src_len, head_dim) caches."""
    keep = mask.astype(bool)
    if not keep.any():
        return 0.0
    return max(float(np.abs(x - y).transpose(0, 2, 1, 3)[keep].max()) for x, y in zip(a, b, strict=True))


def _cached_logits(runtime: OnnxSeq2Seq, dec_ids: np.ndarray, mask: np.ndarray, cross_cache: list[np.ndarray]
                   ) -> np.ndarray:
    """Teacher-forced logits computed one token at a time through the decoder's cache."""
    self_cache = runtime.empty_cache(len(dec_ids))
    steps = []
    for t in range(dec_ids.shape[1]):
        out = runtime.decode(dec_ids[:, t : t + 1], mask, self_cache, cross_cache)
        self_cache = out.self_cache
        steps.append(out.logits)
    return np.concatenate(steps, axis=1)


def _agreement(reference: list[list[int]], hyps: list[list[int]], bleu_reference: float, decode: Any,
               references: list[str]) -> dict[str, Any]:
    """How a runtime's greedy outputs compare with PyTorch's: identical share, corpus BLEU and its delta."""
    import sacrebleu

    identical = sum(a == b for a, b in zip(reference, hyps, strict=True))
    bleu = round(sacrebleu.corpus_bleu(decode(hyps), [references]).score, 2)
    return {
        "identical_share": round(identical / len(reference), 4),
        "bleu": bleu,
        "bleu_delta": round(bleu - bleu_reference, 2),
    }


def check_parity(
    model: Any,
    tokenizer: Any,
    out: Path,
    params: Params,
    sources: list[list[int]],
    targets: list[list[int]],
    references: list[str],
) -> dict[str, Any]:
    """Compare every exported format with the PyTorch model on the parity sentences; returns the figures."""
    import sacrebleu
    import torch

    cfg = model.config
    ids_of = SpecialIds(start=cfg.decoder_start_token_id, eos=cfg.eos_token_id, pad=cfg.pad_token_id)
    settings = params.export
    runtimes: dict[str, OnnxSeq2Seq] = {}
    if settings.onnx:
        runtimes["onnx"] = OnnxSeq2Seq(out / ONNX_FILES["encoder"], out / ONNX_FILES["decoder"], ORT_THREADS)
        if settings.int8:
            runtimes["onnx_int8"] = OnnxSeq2Seq(
                out / ONNX_INT8_FILES["encoder"], out / ONNX_INT8_FILES["decoder"], ORT_THREADS
            )
    torchscript = None
    if settings.torchscript:
        with _quiet_export():
            torchscript = tuple(torch.jit.load(str(out / TORCHSCRIPT_FILES[g])) for g in GRAPHS)
    ct2 = None
    if settings.ctranslate2:
        import ctranslate2

        ct2 = ctranslate2.Translator(str(out / CTRANSLATE2_DIR), device="cpu", inter_threads=1,
                                     intra_threads=ORT_THREADS)
    reference_encoder, _ = export_wrappers(model)

    diff_names = {
        "onnx": ("encoder", "decoder", "decoder_cached", "end_to_end"),
        "torchscript": ("encoder", "decoder"),
    }
    diffs = {fmt: dict.fromkeys(names, 0.0) for fmt, names in diff_names.items()}
    hyps: dict[str, list[list[int]]] = {name: [] for name in ("pytorch", *runtimes, *(["ctranslate2"] if ct2 else []))}
    for start in range(0, len(sources), PARITY_BATCH):
        ids, mask = pad_batch(sources[start : start + PARITY_BATCH], ids_of.pad)
        dec_ids, dec_mask = _teacher_forced_inputs(targets[start : start + PARITY_BATCH], ids_of.start, ids_of.pad)
        t_ids, t_mask, t_dec = (torch.from_numpy(a) for a in (ids, mask, dec_ids))
        with torch.no_grad():
            ref_hidden, *ref_cross = (x.numpy() for x in reference_encoder(t_ids, t_mask))
            ref_logits = model(input_ids=t_ids, attention_mask=t_mask, decoder_input_ids=t_dec).logits.numpy()

        if "onnx" in runtimes:
            runtime, d = runtimes["onnx"], diffs["onnx"]
            hidden, cross = runtime.encode(ids, mask)
            d["encoder"] = max(d["encoder"], _max_diff(hidden, ref_hidden, mask),
                               _max_cache_diff(cross, ref_cross, mask))
            # The decoder is fed PyTorch's cross caches, so these two measure the decoder graph alone.
            empty = runtime.empty_cache(len(ids))
            logits = runtime.decode(dec_ids, mask, empty, ref_cross).logits
            d["decoder"] = max(d["decoder"], _max_diff(logits, ref_logits, dec_mask))
            logits = _cached_logits(runtime, dec_ids, mask, ref_cross)
            d["decoder_cached"] = max(d["decoder_cached"], _max_diff(logits, ref_logits, dec_mask))
            logits = runtime.decode(dec_ids, mask, empty, cross).logits
            d["end_to_end"] = max(d["end_to_end"], _max_diff(logits, ref_logits, dec_mask))
        if torchscript is not None:
            d = diffs["torchscript"]
            with torch.no_grad():
                hidden = torchscript[0](t_ids, t_mask).numpy()
                logits = torchscript[1](t_dec, torch.from_numpy(ref_hidden), t_mask).numpy()
            d["encoder"] = max(d["encoder"], _max_diff(hidden, ref_hidden, mask))
            d["decoder"] = max(d["decoder"], _max_diff(logits, ref_logits, dec_mask))

        if len(hyps) > 1:
            # One length limit for the whole batch, as generate applies it, so both sides decode the same way.
            limit = max_new_tokens(params, ids.shape[1], cfg.max_position_embeddings)
            with torch.no_grad():
                generated = model.generate(
                    input_ids=t_ids,
                    attention_mask=t_mask,
                    num_beams=1,
                    do_sample=False,
                    # max_length counts the start token (max_new_tokens would warn against the saved max_length).
                    max_length=limit + 1,
                    bad_words_ids=[[ids_of.pad]],
                    forced_eos_token_id=ids_of.eos,
                    decoder_start_token_id=ids_of.start,
                    eos_token_id=ids_of.eos,
                    pad_token_id=ids_of.pad,
                )
            hyps["pytorch"] += [strip_hypothesis(row[1:].tolist(), ids_of.eos, ids_of.pad) for row in generated]
            for name, runtime in runtimes.items():
                hyps[name] += beam_search(runtime, ids, mask, beam=1, max_new_tokens=[limit] * len(ids), ids=ids_of)
            if ct2 is not None:
                hyps["ctranslate2"] += _ct2_greedy(ct2, tokenizer, sources[start : start + PARITY_BATCH], limit,
                                                   ids_of.eos)

    report: dict[str, Any] = {"n_sentences": len(sources)}
    checked = [fmt for fmt, present in (("onnx", "onnx" in runtimes), ("torchscript", torchscript is not None))
               if present]
    for fmt in checked:
        report[fmt] = {f"{name}_max_abs_diff": value for name, value in diffs[fmt].items()}
    if len(hyps) == 1:
        return report

    def decode(rows: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(rows, skip_special_tokens=True)

    pytorch_bleu = round(sacrebleu.corpus_bleu(decode(hyps["pytorch"]), [references]).score, 2)
    if "onnx" in runtimes:
        onnx = _agreement(hyps["pytorch"], hyps["onnx"], pytorch_bleu, decode, references)
        report["identical_share"] = onnx["identical_share"]
        report["emitted_pad"] = any(ids_of.pad in h for h in hyps["onnx"])
        report["bleu"] = {"pytorch": pytorch_bleu, "onnx": onnx["bleu"],
                          "delta": round(abs(onnx["bleu"] - pytorch_bleu), 2)}
    for name in ("onnx_int8", "ctranslate2"):
        if name in hyps:
            # Signed: how much BLEU the quantised or converted model gains (+) or loses (-) against PyTorch.
            report[name] = _agreement(hyps["pytorch"], hyps[name], pytorch_bleu, decode, references)
    return report


def _ct2_greedy(translator: Any, tokenizer: Any, sources: list[list[int]], limit: int, eos_id: int) -> list[list[int]]:
    """CTranslate2 greedy outputs as ids ending in </s>, like the other runtimes' (it returns no end token)."""
    tokens = [tokenizer.convert_ids_to_tokens(s) for s in sources]
    # generate's limit-th token is a forced </s>; CTranslate2 stops after max_decoding_length tokens without one.
    results = translator.translate_batch(tokens, beam_size=1, max_decoding_length=max(limit - 1, 1))
    return [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) + [eos_id] for r in results]


def parity_failures(report: dict[str, Any], params: Params) -> list[str]:
    """Each broken threshold as 'figure vs threshold'; empty when the gate passes."""
    limit = params.export.max_logit_diff
    failures = []
    for fmt in ("onnx", "torchscript"):
        for key, value in report.get(fmt, {}).items():
            if key.endswith("_max_abs_diff") and not value <= limit:  # `not <=` also catches NaN
                name = key.removesuffix("_max_abs_diff").replace("_", " ")
                failures.append(f"{fmt} {name} max abs diff {value:.3g} > max_logit_diff {limit:.3g}")
    share = report.get("identical_share")
    if share is not None and share < params.export.min_identical:
        failures.append(
            f"onnx greedy outputs identical to PyTorch for {share:.2%} of {report['n_sentences']} sentences "
            f"< min_identical {params.export.min_identical:.2%}"
        )
    delta = report.get("bleu", {}).get("delta")
    if delta is not None and not delta <= params.export.max_bleu_delta:
        failures.append(f"onnx greedy BLEU differs from PyTorch by {delta:.2f} > max_bleu_delta "
                        f"{params.export.max_bleu_delta:.2f}")
    if report.get("emitted_pad"):
        failures.append("onnx greedy decoding emitted <pad>")
    return failures


# --------------------------------------------------------------------------------------------------- stage


def _load(paths: Paths) -> tuple[Any, Any]:
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    if not (paths.final_model / "config.json").is_file():
        raise MissingArtifact(paths.final_model, "train")
    model = MarianMTModel.from_pretrained(paths.final_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    return model, tokenizer


def _parity_pairs(params: Params, paths: Paths) -> tuple[list[str], list[str]]:
    splits = test_splits(paths.clean)
    if not splits:
        raise MissingArtifact(paths.split_file(paths.clean, "test"), "clean")
    path = paths.split_file(paths.clean, splits[0])
    src, tgt = read_pairs(path)
    if not src:
        raise ParityFailed(f"{path} has no sentence pairs to check parity on")
    n = params.export.parity_sentences
    return src[:n], tgt[:n]


def _size_mb(path: Path) -> float:
    if path.is_dir():
        return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 3)
    return round(path.stat().st_size / 1e6, 3)


def run(params: Params, paths: Paths) -> dict[str, Any]:
    settings = params.export
    if settings.ctranslate2:
        # Fail before minutes of export, not after.
        import importlib.util

        if importlib.util.find_spec("ctranslate2") is None:
            raise OptionalDependencyMissing("ctranslate2", "export.ctranslate2 is true", "pip install 'mtpipe[ct2]'")
    model, tokenizer = _load(paths)
    src_text, tgt_text = _parity_pairs(params, paths)
    cfg = model.config
    pad_id, eos_id, start_id = cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id
    max_positions = cfg.max_position_embeddings
    sources = tokenizer(src_text, truncation=True, max_length=max_positions)["input_ids"]
    targets = tokenizer(text_target=tgt_text, truncation=True, max_length=max_positions)["input_ids"]
    example = _example_inputs(sources, targets, start_id, pad_id)
    metrics: dict[str, Any] = {}
    files: dict[str, Any] = {}

    with atomic_path(paths.export) as out:
        out.mkdir()
        copied = copy_model_files(paths.final_model, out)
        timings: dict[str, Any] = {}
        if settings.onnx:
            timings["onnx"] = export_onnx(model, example, out, settings.opset, params.evaluate.beam)
            files["onnx"] = dict(ONNX_FILES)
            if settings.int8:
                timings["onnx_int8"] = quantize_int8(out)
                files["onnx_int8"] = dict(ONNX_INT8_FILES)
        if settings.torchscript:
            timings["torchscript"] = export_torchscript(model, example, out)
            files["torchscript"] = dict(TORCHSCRIPT_FILES)
        if settings.ctranslate2:
            timings["ctranslate2"] = convert_ctranslate2(paths.final_model, out / CTRANSLATE2_DIR,
                                                         settings.ctranslate2_quantization)
            files["ctranslate2"] = CTRANSLATE2_DIR

        if files:
            log.info("checking parity on %d sentences (%s)", len(sources), ", ".join(files))
            metrics = check_parity(model, tokenizer, out, params, sources, targets, tgt_text)
            failures = parity_failures(metrics, params)
            if failures:
                raise ParityFailed("parity gate failed: " + "; ".join(failures))
            for fmt in ("onnx", "torchscript"):
                if fmt in files:
                    metrics[fmt]["export_seconds"] = timings[fmt]
                    metrics[fmt]["size_mb"] = {g: _size_mb(out / files[fmt][g]) for g in GRAPHS}
            if "onnx_int8" in files:
                metrics["onnx_int8"]["quantize_seconds"] = timings["onnx_int8"]
                metrics["onnx_int8"]["size_mb"] = {g: _size_mb(out / ONNX_INT8_FILES[g]) for g in GRAPHS}
            if "ctranslate2" in files:
                metrics["ctranslate2"]["convert_seconds"] = timings["ctranslate2"]
                metrics["ctranslate2"]["quantization"] = settings.ctranslate2_quantization
                metrics["ctranslate2"]["size_mb"] = _size_mb(out / CTRANSLATE2_DIR)
        metrics["thresholds"] = {
            "max_logit_diff": settings.max_logit_diff,
            "min_identical": settings.min_identical,
            "max_bleu_delta": settings.max_bleu_delta,
        }

        manifest = {
            "version": MANIFEST_VERSION,
            "files": files,
            "model_files": copied,
            "opset": settings.opset if settings.onnx else None,
            "kv_cache": settings.onnx,
            "inputs": {
                "onnx": {"encoder": list(ENCODER_INPUTS), "decoder": decoder_inputs(cfg.decoder_layers)},
                "torchscript": TORCHSCRIPT_INPUTS,
            },
            "outputs": {
                "onnx": {"encoder": encoder_outputs(cfg.decoder_layers),
                         "decoder": decoder_outputs(cfg.decoder_layers)},
                "torchscript": TORCHSCRIPT_OUTPUTS,
            },
            "cache_layout": ["batch", "heads", "length", "head_dim"],
            "next_token_candidates": min(candidates_for_beam(params.evaluate.beam), cfg.vocab_size)
            if settings.onnx else None,
            "vocab_size": cfg.vocab_size,
            "pad_id": pad_id,
            "eos_id": eos_id,
            "decoder_start_id": start_id,
            # Generation must never emit <pad> (Marian starts from it) and forces </s> at the length limit.
            "bad_words_ids": [[pad_id]],
            "dims": {
                "d_model": cfg.d_model,
                "encoder_layers": cfg.encoder_layers,
                "decoder_layers": cfg.decoder_layers,
                "attention_heads": cfg.decoder_attention_heads,
                "max_positions": max_positions,
            },
            # Decoding defaults for `mtpipe translate`: the evaluate stage's settings.
            "generation": {
                "beam": params.evaluate.beam,
                "length_penalty": params.evaluate.length_penalty,
                "max_len_a": params.evaluate.max_len_a,
                "max_len_b": params.evaluate.max_len_b,
            },
            "max_len": {"a": params.evaluate.max_len_a, "b": params.evaluate.max_len_b},
            "parity": {k: metrics[k] for k in ("n_sentences", "identical_share", "bleu", "onnx", "torchscript",
                                               "onnx_int8", "ctranslate2") if k in metrics},
        }
        write_json(out / MANIFEST, manifest)

    write_json(paths.metrics("export"), metrics)
    diffs = [v for f in ("onnx", "torchscript") for k, v in metrics.get(f, {}).items() if k.endswith("_max_abs_diff")]
    summary = {
        "identical_share": metrics.get("identical_share"),
        "max_logit_diff": max(diffs) if diffs else None,
        "bleu_delta": metrics.get("bleu", {}).get("delta"),
        "int8_bleu_delta": metrics.get("onnx_int8", {}).get("bleu_delta"),
    }
    log.info(
        "exported %s to %s: max abs diff %s, identical greedy outputs %s, BLEU delta %s (int8 %s)",
        "+".join(files) or "tokenizer and config only",
        paths.export,
        f"{summary['max_logit_diff']:.2g}" if diffs else "n/a",
        summary["identical_share"],
        summary["bleu_delta"],
        summary["int8_bleu_delta"],
    )
    return summary


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "export")
