"""The manifest the stage writes (pipeline/runtime/export_format.py's ExportManifest), from the model config and
params; the model's languages travel beside it as its languages.json."""

from __future__ import annotations

from typing import Any

from pipeline.params import EvaluateParams, ExportParams
from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.export_format import ExportManifest, Generation, ModelDims, candidates_for_beam

# The parity figures the manifest keeps (metrics/export.json has them all).
PARITY_KEYS = ("n_sentences", "identical_share", "bleu", "onnx", "torchscript", "onnx_int8", "ctranslate2",
               "shortlist", "directions")


def generation_of(evaluate: EvaluateParams) -> Generation:
    """Decoding defaults for `mtpipe translate`: the evaluate stage's settings."""
    return Generation(beam=evaluate.beam, length_penalty=evaluate.length_penalty, max_len_a=evaluate.max_len_a,
                      max_len_b=evaluate.max_len_b)


def build_manifest(model_config: Any, special_ids: SpecialIds, settings: ExportParams, generation: Generation,
                   files: dict[str, Any], model_files: list[str], metrics: dict[str, Any]) -> ExportManifest:
    """The manifest of an export of a model with this (transformers) config: `files` by format, the copied
    `model_files`, and the parity figures from `metrics`."""
    return ExportManifest(
        files=files,
        model_files=tuple(model_files),
        opset=settings.opset if settings.onnx else None,
        kv_cache=settings.onnx,
        next_token_candidates=min(candidates_for_beam(generation.beam), model_config.vocab_size)
        if settings.onnx else None,
        vocab_size=model_config.vocab_size,
        special_ids=special_ids,
        dims=ModelDims(
            d_model=model_config.d_model,
            encoder_layers=model_config.encoder_layers,
            decoder_layers=model_config.decoder_layers,
            attention_heads=model_config.decoder_attention_heads,
            max_positions=model_config.max_position_embeddings,
        ),
        generation=generation,
        parity={key: metrics[key] for key in PARITY_KEYS if key in metrics},
    )
