"""The parity check: every exported format against the model as PyTorch runs it, on the parity sentences of every
direction the model translates.

Each direction's sentences are run in padded batches of PARITY_BATCH (a batch holds one direction, so every
figure can be told per direction, and every runtime decodes it from that direction's decoder prefix). Per batch,
graph_diffs.py measures the fp32 ONNX and the TorchScript graphs' outputs against PyTorch's, and
greedy_agreement.py decodes greedily with PyTorch and every other runtime (fp32 and int8 ONNX, CTranslate2). A
direction's report holds the largest difference over its batches per figure and its greedy agreement; the overall
report (the top level of metrics/export.json) pools every direction's sentences: the largest difference of any,
the agreement over all of them. gate.py decides, per direction, what fails the stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.params import ExportParams
from pipeline.runtime.decoding import SpecialIds, output_limit, pad_batch
from pipeline.runtime.export_format import CTRANSLATE2_DIR, ONNX_FILES, ONNX_INT8_FILES, Generation
from pipeline.runtime.model_languages import DirectionLayout
from pipeline.runtime.translate import OnnxSeq2Seq
from stages.export.ctranslate2_model import starts_itself
from stages.export.graph_diffs import ONNX_DIFFS, TORCHSCRIPT_DIFFS, ParityBatch, onnx_diffs, torchscript_diffs, worst
from stages.export.greedy_agreement import CTranslate2Runtime, greedy_outputs, greedy_report
from stages.export.stage_inputs import ParityPairs
from stages.export.torchscript import load_torchscript
from stages.export.wrappers import export_wrappers

ORT_THREADS = 2
# Parity sentences are run in batches of this many (padded), which bounds the teacher-forced logits' memory.
PARITY_BATCH = 16


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
