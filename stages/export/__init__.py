"""export: the trained model as ONNX graphs with a KV cache, the format `mtpipe translate` runs (plus int8, legacy
TorchScript and CTranslate2 options), published in a self-contained `models/export` (the tokenizer files, configs,
languages.json and the manifest `export.json` beside the graphs) only when every direction the model translates
passes a parity check against PyTorch; otherwise `ParityFailed` names the direction and nothing is published. The
model is a Marian model trained from scratch or a fine-tuned checkpoint of a supported family
(pipeline/runtime/families.py), loaded with AutoModelForSeq2SeqLM; its directions, family and each direction's layout
(pipeline/runtime/model_languages.py: the ids around a source's pieces, the decoder prefix every runtime decodes
after) go into the manifest, so the graphs themselves know nothing of languages. The figures go to
`metrics/export.json`: every direction's sentences pooled at the top level, each direction under `directions`; what
is gated, and why: README.md's "Translating with the export" and gate.py.

    stage_inputs       what the stage reads: the model, its languages, every direction's parity pairs
    wrappers           the torch modules the graphs are traced from, and the batch they are traced on
    onnx_graphs        encoder.onnx and the KV-cached decoder.onnx, and their int8 quantisation
    torchscript        the legacy TorchScript graphs (torch deprecates TorchScript)
    ctranslate2_model  the CTranslate2 directory (`pip install mtpipe[ct2]`): conversion, greedy decoding
    quiet              the exporters' known, harmless chatter, quieted
    parity             every format against PyTorch: graph differences and greedy agreement, per direction
    gate               which figures break their `export.*` thresholds, and what to do
    shortlist          the lexical shortlist (`export.shortlist`) and its beam-search agreement with the full decoder
    manifest           export.json
    (this module)      run: the formats, the model files copied beside them, the gate, the manifest, the figures

Importing this package imports neither torch nor onnx: the modules that do are imported when the stage runs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, write_json
from pipeline.cpu_features import int8_dot_products_saturate
from pipeline.errors import MissingArtifact, ParityFailed
from pipeline.params import ExportParams, Params
from pipeline.run_figures import largest_graph_diff
from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.export_format import (
    CTRANSLATE2_DIR,
    GRAPHS,
    ONNX_FILES,
    ONNX_INT8_FILES,
    SHORTLIST_FILES,
    TORCHSCRIPT_FILES,
    Generation,
)
from pipeline.runtime.model_languages import LANGUAGES_FILE, ModelLanguages
from pipeline.runtime.text_pieces import TOKENIZER_CONFIG, TOKENIZER_FILES
from stages.export.ctranslate2_model import require_ctranslate2, start_row_norm
from stages.export.gate import gate_message
from stages.export.manifest import build_manifest, generation_of
from stages.export.stage_inputs import ParityPairs, load_model, parity_pairs, special_ids_of

log = logging.getLogger("mtpipe.export")

# Files of models/final that are the PyTorch weights; everything else (tokenizer, configs) is copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")


def required_model_files(family: str) -> tuple[str, ...]:
    """What `mtpipe translate` reads besides the graphs and the manifest: the family's tokenizer files
    (pipeline.runtime.text_pieces), the tokenizer config and languages.json (directions and layouts)."""
    return (*TOKENIZER_FILES[family], TOKENIZER_CONFIG, LANGUAGES_FILE)


def copy_model_files(final_model: Path, out: Path, family: str) -> list[str]:
    """Copy the tokenizer files, config.json, generation_config.json and languages.json (everything but the
    weights), so the export directory is self-contained; returns their names. PipelineError naming the files
    when models/final lacks one a `family` model is translated with."""
    missing = [name for name in required_model_files(family) if not (final_model / name).is_file()]
    if missing:
        raise PipelineError(f"{final_model}: no {', '.join(missing)}, which translating with a {family} export "
                            "needs: train it again (`dvc repro tokenize train`)")
    copied = []
    for f in sorted(final_model.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, out / f.name)
            copied.append(f.name)
    return copied


def size_mb(path: Path) -> float:
    """The size of a file, or of every file under a directory, in MB."""
    if path.is_dir():
        return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 3)
    return round(path.stat().st_size / 1e6, 3)


def _export_formats(model: Any, pairs: ParityPairs, special_ids: SpecialIds, final_model: Path, out: Path,
                    settings: ExportParams, beam: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write every format `settings` asks for into `out`, the graphs traced on `pairs` (one direction's); returns
    ({format: its files}, {format: seconds})."""
    files: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    if settings.onnx or settings.torchscript:
        from stages.export.wrappers import example_inputs

        example = example_inputs(pairs.sources, pairs.targets, pairs.layout, special_ids.pad)
    if settings.onnx:
        from stages.export import onnx_graphs

        timings["onnx"] = onnx_graphs.export_onnx(model, example, out, settings.opset, beam, settings.shortlist,
                                                  settings.int8)
        files["onnx"] = dict(ONNX_FILES)
        if settings.int8:
            timings["onnx_int8"] = onnx_graphs.quantize_int8(out, settings.shortlist)
            files["onnx_int8"] = dict(ONNX_INT8_FILES)
        if settings.shortlist:
            precisions = ("onnx", "onnx_int8") if settings.int8 else ("onnx",)
            files["shortlist"] = {name: SHORTLIST_FILES[name] for name in ("table", "projection", *precisions)}
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


def _gated_parity(model: Any, tokenizer: Any, out: Path, settings: ExportParams, generation: Generation,
                  special_ids: SpecialIds, pairs: dict[str, ParityPairs], paths: Paths) -> dict[str, Any]:
    """The exported formats' parity with the model, refused (raising inside atomic_path, so nothing is published)
    when it misses the thresholds; the message names the causes this machine and the run's figures point to."""
    from stages.export.parity import check_parity

    metrics = check_parity(model, tokenizer, out, settings, generation, special_ids, pairs)
    failed = gate_message(metrics, settings, start_row_norm(model, special_ids.pad), int8_dot_products_saturate(),
                          paths.section("export"), paths.stage("train"))
    if failed:
        raise ParityFailed(failed)
    return metrics


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
    if not (paths.final_model / "config.json").is_file():
        raise MissingArtifact(paths.final_model, "train")
    languages = ModelLanguages.read(paths.final_model)  # refuses an unsupported family before anything loads
    model, tokenizer = load_model(paths)
    directions = languages.directions
    model_config = model.config
    special_ids = special_ids_of(model_config, languages)
    pairs = parity_pairs(paths, languages, settings.parity_sentences, tokenizer,
                         model_config.max_position_embeddings)
    generation = generation_of(params.evaluate)
    metrics: dict[str, Any] = {}

    with atomic_path(paths.export) as out:
        out.mkdir()
        model_files = copy_model_files(paths.final_model, out, languages.family.name)
        files, timings = _export_formats(model, pairs[directions.names[0]], special_ids, paths.final_model, out,
                                         settings, generation.beam)
        if files:
            log.info("checking parity on %d sentences of %s (%s)", sum(len(p.sources) for p in pairs.values()),
                     ", ".join(directions.names), ", ".join(files))
            metrics = _gated_parity(model, tokenizer, out, settings, generation, special_ids, pairs, paths)
            _add_costs(metrics, files, timings, out, settings)
        if settings.shortlist:
            from stages.export.shortlist import shortlist_agreement, write_shortlist

            table, built = write_shortlist(paths, tokenizer, settings, model_config.vocab_size, special_ids.eos, out)
            metrics["shortlist"] = {**built, **shortlist_agreement(
                table, out, files, generation, special_ids, pairs, tokenizer, model_config.max_position_embeddings)}
        metrics["thresholds"] = {
            "max_logit_diff": settings.max_logit_diff,
            "min_identical": settings.min_identical,
            "max_bleu_delta": settings.max_bleu_delta,
        }
        build_manifest(model_config, special_ids, settings, generation, files, model_files, metrics).write(out)

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
