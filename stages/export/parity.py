"""The parity check: every exported format against the model as PyTorch runs it, on the parity sentences of every
direction the model translates, in padded batches of PARITY_BATCH that each hold one direction (so every figure can
be told per direction, and every runtime decodes from that direction's decoder prefix). Per batch it measures the
graphs, as max abs differences over the real (unpadded) positions: the fp32 ONNX encoder (states and cross caches),
its decoder fed PyTorch's cross caches with the whole prefix at once (`decoder`) and one token at a time through its
cache (`decoder_cached`), and end to end (ONNX encoder into ONNX decoder); the TorchScript encoder and uncached
decoder. And it decodes greedily with every runtime against `model.generate` (pipeline/prefixed_generate.py), with
one length limit per batch as generate applies it: the ONNX graphs (fp32 and int8) through
pipeline.runtime.beam_search with beam 1, CTranslate2 with beam_size 1 and the prefix as its target_prefix.
Agreement is the share of token-identical outputs and the corpus BLEU (sacreBLEU, cased, 13a) against the
references, with its delta to PyTorch's. A direction's report holds the largest difference over its batches per
figure and its agreement; the overall report (the top level of metrics/export.json) pools every direction's
sentences. gate.py decides, per direction, what fails the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.params import ExportParams
from pipeline.runtime.beam_search import beam_search
from pipeline.runtime.decoding import SpecialIds, output_limit, pad_batch
from pipeline.runtime.export_format import CTRANSLATE2_DIR, ONNX_FILES, ONNX_INT8_FILES, Generation
from pipeline.runtime.model_languages import DirectionLayout
from pipeline.runtime.translate import OnnxSeq2Seq
from stages.export.ctranslate2_model import greedy_ids, starts_itself, target_prefix
from stages.export.stage_inputs import ParityPairs
from stages.export.torchscript import load_torchscript
from stages.export.wrappers import export_wrappers

ORT_THREADS = 2
# Parity sentences are run in batches of this many (padded), which bounds the teacher-forced logits' memory.
PARITY_BATCH = 16
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


# --------------------------------------------------------------------------------------------------- graph differences


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


# --------------------------------------------------------------------------------------------------- greedy agreement


@dataclass(frozen=True)
class CTranslate2Runtime:
    """A CTranslate2 translator and whether it puts its own start token in front of the target prefix
    (ctranslate2_model.starts_itself)."""

    translator: Any
    starts_itself: bool


def pytorch_greedy(model: Any, batch: ParityBatch, layout: DirectionLayout, limit: int, special_ids: SpecialIds
                   ) -> list[list[int]]:
    """`model.generate`'s greedy outputs after the decoder prefix (ids up to and including </s>), never emitting
    <pad>, </s> forced at the limit."""
    from pipeline.prefixed_generate import generate_from_prefix

    with torch.no_grad():
        return generate_from_prefix(
            model,
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            layout.decoder_prefix,
            limit,
            eos_id=special_ids.eos,
            pad_id=special_ids.pad,
            num_beams=1,
            bad_words_ids=[[special_ids.pad]],
            forced_eos_token_id=special_ids.eos,
            eos_token_id=special_ids.eos,
            pad_token_id=special_ids.pad,
        )


def greedy_outputs(model: Any, onnx_runtimes: Mapping[str, OnnxSeq2Seq], ctranslate2: CTranslate2Runtime | None,
                   tokenizer: Any, batch: ParityBatch, layout: DirectionLayout, limit: int, special_ids: SpecialIds
                   ) -> dict[str, list[list[int]]]:
    """{"pytorch", each ONNX runtime's name, "ctranslate2" (when given): greedy ids of the batch after the
    direction's decoder prefix}."""
    outputs = {"pytorch": pytorch_greedy(model, batch, layout, limit, special_ids)}
    for name, runtime in onnx_runtimes.items():
        outputs[name] = beam_search(runtime, batch.input_ids, batch.attention_mask, beam=1,
                                    max_new_tokens=[limit] * len(batch.sources), ids=special_ids,
                                    decoder_prefix=layout.decoder_prefix)
    if ctranslate2 is not None:
        prefix = target_prefix(layout, tokenizer, ctranslate2.starts_itself)
        outputs["ctranslate2"] = greedy_ids(ctranslate2.translator, tokenizer, batch.sources, prefix,
                                            ctranslate2.starts_itself, limit, special_ids.eos)
    return outputs


def agreement(reference: list[list[int]], hyps: list[list[int]], bleu_reference: float,
              decode: Callable[[list[list[int]]], list[str]], references: list[str]) -> dict[str, Any]:
    """How a runtime's greedy outputs compare with PyTorch's: identical share, corpus BLEU and its signed delta
    (how much BLEU the runtime gains (+) or loses (-) against PyTorch)."""
    import sacrebleu

    identical = sum(a == b for a, b in zip(reference, hyps, strict=True))
    bleu = round(sacrebleu.corpus_bleu(decode(hyps), [references]).score, 2)
    return {
        "identical_share": round(identical / len(reference), 4),
        "bleu": bleu,
        "bleu_delta": round(bleu - bleu_reference, 2),
    }


def greedy_report(hyps: dict[str, list[list[int]]], tokenizer: Any, references: list[str], pad_id: int
                  ) -> dict[str, Any]:
    """The fp32 ONNX graphs' figures (identical_share, emitted_pad, bleu with its absolute delta) and the int8
    graphs' and CTranslate2's (their `agreement`); gate.py says which are gated."""
    import sacrebleu

    def decode(rows: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(rows, skip_special_tokens=True)

    report: dict[str, Any] = {}
    pytorch_bleu = round(sacrebleu.corpus_bleu(decode(hyps["pytorch"]), [references]).score, 2)
    if "onnx" in hyps:
        onnx = agreement(hyps["pytorch"], hyps["onnx"], pytorch_bleu, decode, references)
        report["identical_share"] = onnx["identical_share"]
        report["emitted_pad"] = any(pad_id in h for h in hyps["onnx"])
        report["bleu"] = {"pytorch": pytorch_bleu, "onnx": onnx["bleu"],
                          "delta": round(abs(onnx["bleu"] - pytorch_bleu), 2)}
    for name in ("onnx_int8", "ctranslate2"):
        if name in hyps:
            report[name] = agreement(hyps["pytorch"], hyps[name], pytorch_bleu, decode, references)
    return report


# --------------------------------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class ParityRuntimes:
    """The exported formats, loaded: ONNX sessions by format name ("onnx", "onnx_int8"), the TorchScript
    (encoder, decoder), a CTranslate2 translator; each only where exported."""

    onnx: dict[str, OnnxSeq2Seq]
    torchscript: tuple[Any, Any] | None
    ctranslate2: CTranslate2Runtime | None

    def decode_greedily(self) -> bool:
        """Whether any runtime decodes (TorchScript alone is compared on its graphs only)."""
        return bool(self.onnx) or self.ctranslate2 is not None


def load_runtimes(out: Path, settings: ExportParams) -> ParityRuntimes:
    onnx: dict[str, OnnxSeq2Seq] = {}
    if settings.onnx:
        onnx["onnx"] = OnnxSeq2Seq(out / ONNX_FILES["encoder"], out / ONNX_FILES["decoder"], ORT_THREADS)
        if settings.int8:
            onnx["onnx_int8"] = OnnxSeq2Seq(out / ONNX_INT8_FILES["encoder"], out / ONNX_INT8_FILES["decoder"],
                                            ORT_THREADS)
    ctranslate2 = None
    if settings.ctranslate2:
        import ctranslate2 as ct2

        model_dir = out / CTRANSLATE2_DIR
        ctranslate2 = CTranslate2Runtime(ct2.Translator(str(model_dir), device="cpu", inter_threads=1,
                                                        intra_threads=ORT_THREADS), starts_itself(model_dir))
    return ParityRuntimes(onnx, load_torchscript(out) if settings.torchscript else None, ctranslate2)


def reference_batch(model: Any, reference_encoder: Any, sources: list[list[int]], targets: list[list[int]],
                    layout: DirectionLayout, pad_id: int) -> ParityBatch:
    """A padded batch of one direction's pairs with the PyTorch model's encoder states, cross caches and
    teacher-forced logits (the decoder fed the direction's start, then the labels without the last, as the
    model's own label shift does)."""
    ids, mask = pad_batch(sources, pad_id)
    decoder_ids, decoder_mask = pad_batch([[layout.decoder_start, *t[:-1]] for t in targets], pad_id)
    input_ids, attention_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.no_grad():
        hidden, *cross = (x.numpy() for x in reference_encoder(input_ids, attention_mask))
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       decoder_input_ids=torch.from_numpy(decoder_ids)).logits.numpy()
    return ParityBatch(sources, ids, mask, decoder_ids, decoder_mask, hidden, cross, logits)


def _keep_worst(figures: dict[str, float], batch_figures: dict[str, float]) -> None:
    for name, value in batch_figures.items():
        figures[name] = worst(figures[name], value)


@dataclass
class _Measured:
    """What the runtimes did on some parity sentences: the worst graph differences per format and the greedy ids
    per runtime, in sentence order."""

    diffs: dict[str, dict[str, float]]
    hyps: dict[str, list[list[int]]]

    def add(self, other: _Measured) -> None:
        for fmt, figures in other.diffs.items():
            _keep_worst(self.diffs.setdefault(fmt, dict(figures)), figures)
        for name, ids in other.hyps.items():
            self.hyps.setdefault(name, []).extend(ids)


def _measure(model: Any, tokenizer: Any, reference_encoder: Any, runtimes: ParityRuntimes, generation: Generation,
             special_ids: SpecialIds, pairs: ParityPairs) -> _Measured:
    """Every runtime on one direction's parity pairs, PARITY_BATCH at a time."""
    diffs: dict[str, dict[str, float]] = {}
    if "onnx" in runtimes.onnx:
        diffs["onnx"] = dict.fromkeys(ONNX_DIFFS, 0.0)
    if runtimes.torchscript is not None:
        diffs["torchscript"] = dict.fromkeys(TORCHSCRIPT_DIFFS, 0.0)
    hyps: dict[str, list[list[int]]] = {}
    max_positions = model.config.max_position_embeddings
    for start in range(0, len(pairs.sources), PARITY_BATCH):
        batch = reference_batch(model, reference_encoder, pairs.sources[start : start + PARITY_BATCH],
                                pairs.targets[start : start + PARITY_BATCH], pairs.layout, special_ids.pad)
        if "onnx" in diffs:
            _keep_worst(diffs["onnx"], onnx_diffs(runtimes.onnx["onnx"], batch))
        if "torchscript" in diffs:
            _keep_worst(diffs["torchscript"], torchscript_diffs(runtimes.torchscript, batch))
        if runtimes.decode_greedily():
            # One length limit for the whole batch, as generate applies it, so every runtime decodes the same way;
            # the decoder prefix takes positions too.
            limit = min(output_limit(batch.input_ids.shape[1], generation.max_len_a, generation.max_len_b,
                                     max_positions), max_positions - len(pairs.layout.decoder_prefix))
            for name, ids in greedy_outputs(model, runtimes.onnx, runtimes.ctranslate2, tokenizer, batch,
                                            pairs.layout, limit, special_ids).items():
                hyps.setdefault(name, []).extend(ids)
    return _Measured(diffs, hyps)


def _report(measured: _Measured, tokenizer: Any, references: list[str], pad_id: int) -> dict[str, Any]:
    report: dict[str, Any] = {"n_sentences": len(references)}
    for fmt, figures in measured.diffs.items():
        report[fmt] = {f"{name}_max_abs_diff": value for name, value in figures.items()}
    if measured.hyps:
        report.update(greedy_report(measured.hyps, tokenizer, references, pad_id))
    return report


def check_parity(
    model: Any,
    tokenizer: Any,
    out: Path,
    settings: ExportParams,
    generation: Generation,
    special_ids: SpecialIds,
    pairs: Mapping[str, ParityPairs],
) -> dict[str, Any]:
    """Compare every exported format in `out` with the PyTorch model on each direction's parity pairs; returns the
    overall figures with each direction's under "directions". Greedy decoding follows the length rule of
    `generation` (the manifest's)."""
    runtimes = load_runtimes(out, settings)
    reference_encoder, _ = export_wrappers(model)
    overall = _Measured({}, {})
    references: list[str] = []
    per_direction: dict[str, Any] = {}
    for name, direction_pairs in pairs.items():
        measured = _measure(model, tokenizer, reference_encoder, runtimes, generation, special_ids, direction_pairs)
        per_direction[name] = {"split": direction_pairs.split,
                               **_report(measured, tokenizer, direction_pairs.references, special_ids.pad)}
        overall.add(measured)
        references += direction_pairs.references
    return {**_report(overall, tokenizer, references, special_ids.pad), "directions": per_direction}
