"""How far an exported graph's outputs are from PyTorch's: max abs differences over the real (unpadded) positions
of one batch of parity sentences.

ONNX: the encoder (states and cross caches), the decoder fed PyTorch's cross caches with the whole prefix at once
(`decoder`) and one token at a time through its cache (`decoder_cached`), and end to end (ONNX encoder into ONNX
decoder). TorchScript: the encoder and the uncached decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.runtime.translate import OnnxSeq2Seq

ONNX_DIFFS = ("encoder", "decoder", "decoder_cached", "end_to_end")
TORCHSCRIPT_DIFFS = ("encoder", "decoder")


@dataclass(frozen=True)
class ParityBatch:
    """One padded batch of parity pairs, as every runtime takes it, with the PyTorch model's outputs on it."""

    sources: list[list[int]]  # the source ids, unpadded
    input_ids: np.ndarray
    attention_mask: np.ndarray
    decoder_input_ids: np.ndarray  # teacher forcing: the start token, then the reference without its last token
    decoder_mask: np.ndarray
    reference_hidden: np.ndarray
    reference_cross_cache: list[np.ndarray]
    reference_logits: np.ndarray


def max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Max abs difference over the real (unpadded) positions of (batch, length, dim) arrays (NaN if any is)."""
    keep = mask.astype(bool)
    return float(np.abs(a[keep] - b[keep]).max()) if keep.any() else 0.0


def max_cache_diff(a: list[np.ndarray], b: list[np.ndarray], mask: np.ndarray) -> float:
    """Max abs difference over the real source positions of per-layer (batch, heads, src_len, head_dim) caches."""
    keep = mask.astype(bool)
    if not keep.any():
        return 0.0
    return worst(*(float(np.abs(x - y).transpose(0, 2, 1, 3)[keep].max()) for x, y in zip(a, b, strict=True)))


def worst(*diffs: float) -> float:
    """The largest difference; NaN if any is NaN (Python's max would drop a NaN that is not first)."""
    return float(np.max(diffs))


def cached_logits(runtime: OnnxSeq2Seq, decoder_input_ids: np.ndarray, mask: np.ndarray,
                  cross_cache: list[np.ndarray]) -> np.ndarray:
    """Teacher-forced logits computed one token at a time through the decoder's cache."""
    self_cache = runtime.empty_cache(len(decoder_input_ids))
    steps = []
    for t in range(decoder_input_ids.shape[1]):
        out = runtime.decode(decoder_input_ids[:, t : t + 1], mask, self_cache, cross_cache)
        self_cache = out.self_cache
        steps.append(out.logits)
    return np.concatenate(steps, axis=1)


def onnx_diffs(runtime: OnnxSeq2Seq, batch: ParityBatch) -> dict[str, float]:
    """{ONNX_DIFFS name: max abs diff} of the fp32 graphs on one batch."""
    mask, decoder_mask = batch.attention_mask, batch.decoder_mask
    hidden, cross = runtime.encode(batch.input_ids, mask)
    empty = runtime.empty_cache(len(batch.input_ids))
    # The decoder is fed PyTorch's cross caches, so `decoder` and `decoder_cached` measure the decoder graph alone.
    decoder = runtime.decode(batch.decoder_input_ids, mask, empty, batch.reference_cross_cache).logits
    decoder_cached = cached_logits(runtime, batch.decoder_input_ids, mask, batch.reference_cross_cache)
    end_to_end = runtime.decode(batch.decoder_input_ids, mask, empty, cross).logits
    return {
        "encoder": worst(max_diff(hidden, batch.reference_hidden, mask),
                         max_cache_diff(cross, batch.reference_cross_cache, mask)),
        "decoder": max_diff(decoder, batch.reference_logits, decoder_mask),
        "decoder_cached": max_diff(decoder_cached, batch.reference_logits, decoder_mask),
        "end_to_end": max_diff(end_to_end, batch.reference_logits, decoder_mask),
    }


def torchscript_diffs(torchscript: tuple[Any, Any], batch: ParityBatch) -> dict[str, float]:
    """{TORCHSCRIPT_DIFFS name: max abs diff} of the (encoder, decoder) TorchScript modules on one batch."""
    import torch

    encoder, decoder = torchscript
    ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
    with torch.no_grad():
        hidden = encoder(ids, mask).numpy()
        logits = decoder(torch.from_numpy(batch.decoder_input_ids), torch.from_numpy(batch.reference_hidden),
                         mask).numpy()
    return {
        "encoder": max_diff(hidden, batch.reference_hidden, batch.attention_mask),
        "decoder": max_diff(logits, batch.reference_logits, batch.decoder_mask),
    }
