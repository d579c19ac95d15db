"""export: the trained model as ONNX graphs with a KV cache (plus int8, legacy TorchScript and CTranslate2 options),
gated by a parity check against PyTorch.

ONNX (`export.onnx`), the format `mtpipe translate` runs: an encoder that also computes every decoder layer's
cross-attention keys and values once per sentence, and a decoder that appends the new tokens' self-attention keys
and values to the ones it is given, so a step costs O(length) instead of re-running the prefix; `cache_rows` names
the row of the given cache each row continues from, so beam search reorders hypotheses without copying caches
itself. The decoder also returns each row's best 2 x evaluate.beam + 1 next tokens with their log-softmax (what a
beam of that width needs), so beam search does not sort the vocabulary in numpy. The format (file and graph names,
cache layout, the manifest `export.json`) is pipeline/runtime/export_format.py; the runtime is
pipeline/runtime/translate.py.

Options: `export.int8` adds `encoder.int8.onnx`/`decoder.int8.onnx` (int8.py); `export.torchscript` traces the
encoder and an uncached decoder (torchscript.py; legacy: torch deprecates TorchScript); `export.ctranslate2`
converts the model to a CTranslate2 directory (ctranslate2_model.py; `pip install mtpipe[ct2]`). `models/export`
also gets the tokenizer files, config.json, generation_config.json, languages.json and the manifest, so it is
self-contained.

The model is a Marian model trained from scratch or a fine-tuned checkpoint of a supported family (Marian/OPUS-MT,
mBART, mBART-50, M2M-100, NLLB: pipeline/runtime/families.py), loaded with AutoModelForSeq2SeqLM; the cached decoder is
written in the family's architecture (wrappers.py: positions, layer norms and embedding scale differ). Its
languages are its `languages.json` (written by tokenize, copied with the tokenizer): the directions, recorded in
the manifest with the family and `target_tags`, and each direction's layout (pipeline/runtime/model_languages.py): the
ids around a source's pieces (a Marian `>>fr<<` tag, an mBART-50 `en_XX`) and the decoder prefix (`</s> de_DE`) every
runtime decodes after, so the graphs themselves know nothing of languages.

The parity check (parity.py) runs, for every direction, on its first `export.parity_sentences` pairs of the first
test split that holds it (of the valid split where none does; stage_inputs.py), laid out as the model reads them,
against the model as PyTorch runs it (`generate` from the same decoder prefix), and the gate (gate.py) fails the
stage (`ParityFailed`, naming the direction; nothing published) unless, for every direction,
  - every fp32 graph's outputs are within `export.max_logit_diff` (max abs) of PyTorch: encoder states and cross
    caches, teacher-forced decoder logits fed the whole prefix at once, the same fed one token at a time through the
    cache, and end to end (ONNX encoder into ONNX decoder);
  - greedy decoding with ONNX Runtime through the cache gives token-identical output to `model.generate` for at
    least `export.min_identical` of the sentences, never emits <pad>, and its corpus BLEU is within
    `export.max_bleu_delta` of PyTorch's;
  - the CTranslate2 model's greedy outputs likewise, against `export.ctranslate2_min_identical` and
    `export.ctranslate2_max_bleu_delta` (its own thresholds: its default int8 quantisation changes some outputs);
    the failure says what to do, e.g. that a Marian model's <pad> row is not zero (ctranslate2_model.py).
The int8 graphs are reported (identical share, BLEU and its delta), not gated: quantisation is expected to change
some outputs. Figures go to `metrics/export.json`: overall (every direction's sentences pooled) at the top level,
and per direction under `directions`.

Modules: wrappers.py (the traced torch modules), trace_inputs.py, onnx_graphs.py, int8.py, torchscript.py,
ctranslate2_model.py, quiet.py (the exporters' chatter), export_files.py, stage_inputs.py, graph_diffs.py and
greedy_agreement.py (the parity measurements), parity.py, gate.py, manifest.py. Importing this package imports
neither torch nor onnx: the modules that do are imported when the stage runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, write_json
from pipeline.errors import ParityFailed
from pipeline.params import ExportParams, Params
from pipeline.run_figures import largest_graph_diff
from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.export_format import (
    CTRANSLATE2_DIR,
    GRAPHS,
    ONNX_FILES,
    ONNX_INT8_FILES,
    TORCHSCRIPT_FILES,
)
from stages.export.ctranslate2_model import require_ctranslate2, start_row_norm
from stages.export.export_files import copy_model_files, size_mb
from stages.export.gate import gate_message
from stages.export.manifest import build_manifest, generation_of
from stages.export.stage_inputs import ParityPairs, load_model, model_languages, parity_pairs, special_ids_of

log = logging.getLogger("mtpipe.export")


def _export_formats(model: Any, pairs: ParityPairs, special_ids: SpecialIds, final_model: Path, out: Path,
                    settings: ExportParams, beam: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write every format `settings` asks for into `out`, the graphs traced on `pairs` (one direction's); returns
    ({format: its files}, {format: seconds})."""
    files: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    if settings.onnx or settings.torchscript:
        from stages.export.trace_inputs import example_inputs

        example = example_inputs(pairs.sources, pairs.targets, pairs.layout, special_ids.pad)
    if settings.onnx:
        from stages.export import onnx_graphs

        timings["onnx"] = onnx_graphs.export_onnx(model, example, out, settings.opset, beam)
        files["onnx"] = dict(ONNX_FILES)
        if settings.int8:
            from stages.export.int8 import quantize_int8

            timings["onnx_int8"] = quantize_int8(out)
            files["onnx_int8"] = dict(ONNX_INT8_FILES)
    if settings.torchscript:
        from stages.export.torchscript import export_torchscript

        timings["torchscript"] = export_torchscript(model, example, out)
        files["torchscript"] = dict(TORCHSCRIPT_FILES)
    if settings.ctranslate2:
        from stages.export.ctranslate2_model import convert_ctranslate2

        timings["ctranslate2"] = convert_ctranslate2(final_model, out / CTRANSLATE2_DIR,
                                                     settings.ctranslate2_quantization)
        files["ctranslate2"] = CTRANSLATE2_DIR
    return files, timings


def _add_costs(metrics: dict[str, Any], files: dict[str, Any], timings: dict[str, Any], out: Path,
               settings: ExportParams) -> None:
    """Each format's export seconds and size in MB, beside its parity figures."""
    for fmt in ("onnx", "torchscript"):
        if fmt in files:
            metrics[fmt]["export_seconds"] = timings[fmt]
            metrics[fmt]["size_mb"] = {graph: size_mb(out / files[fmt][graph]) for graph in GRAPHS}
    if "onnx_int8" in files:
        metrics["onnx_int8"]["quantize_seconds"] = timings["onnx_int8"]
        metrics["onnx_int8"]["size_mb"] = {graph: size_mb(out / ONNX_INT8_FILES[graph]) for graph in GRAPHS}
    if "ctranslate2" in files:
        metrics["ctranslate2"]["convert_seconds"] = timings["ctranslate2"]
        metrics["ctranslate2"]["quantization"] = settings.ctranslate2_quantization
        metrics["ctranslate2"]["size_mb"] = size_mb(out / CTRANSLATE2_DIR)
        metrics["ctranslate2"]["thresholds"] = {"min_identical": settings.ctranslate2_min_identical,
                                                "max_bleu_delta": settings.ctranslate2_max_bleu_delta}


def _summary(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "identical_share": metrics.get("identical_share"),
        "max_logit_diff": largest_graph_diff(metrics),
        "bleu_delta": metrics.get("bleu", {}).get("delta"),
        "int8_bleu_delta": metrics.get("onnx_int8", {}).get("bleu_delta"),
    }


def run(params: Params, paths: Paths) -> dict[str, Any]:
    settings = params.export
    if settings.ctranslate2:
        require_ctranslate2()  # before minutes of export, not after
    model, tokenizer = load_model(paths)
    languages = model_languages(paths.final_model)
    directions = languages.directions
    model_config = model.config
    special_ids = special_ids_of(model_config, languages)
    pairs = parity_pairs(paths, languages, settings.parity_sentences, tokenizer,
                         model_config.max_position_embeddings)
    n_sentences = sum(len(p.sources) for p in pairs.values())
    generation = generation_of(params.evaluate)
    metrics: dict[str, Any] = {}

    with atomic_path(paths.export) as out:
        out.mkdir()
        model_files = copy_model_files(paths.final_model, out, languages.family)
        files, timings = _export_formats(model, pairs[directions.names[0]], special_ids, paths.final_model, out,
                                         settings, generation.beam)
        if files:
            from stages.export.parity import check_parity

            log.info("checking parity on %d sentences of %s (%s)", n_sentences, ", ".join(directions.names),
                     ", ".join(files))
            metrics = check_parity(model, tokenizer, out, settings, generation, special_ids, pairs)
            failed = gate_message(metrics, settings, start_row_norm(model, special_ids.pad))
            if failed:
                raise ParityFailed(failed)  # inside atomic_path: nothing is published
            _add_costs(metrics, files, timings, out, settings)
        metrics["thresholds"] = {
            "max_logit_diff": settings.max_logit_diff,
            "min_identical": settings.min_identical,
            "max_bleu_delta": settings.max_bleu_delta,
        }
        build_manifest(model_config, special_ids, settings, generation, languages, files, model_files,
                       metrics).write(out)

    write_json(paths.metrics("export"), metrics)
    summary = _summary(metrics)
    log.info(
        "exported %s to %s: max abs diff %s, identical greedy outputs %s, BLEU delta %s (int8 %s)",
        "+".join(files) or "tokenizer and config only",
        paths.export,
        "n/a" if summary["max_logit_diff"] is None else f"{summary['max_logit_diff']:.2g}",
        summary["identical_share"],
        summary["bleu_delta"],
        summary["int8_bleu_delta"],
    )
    return summary
