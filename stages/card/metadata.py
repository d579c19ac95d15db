"""The model card's YAML metadata, in the Hugging Face format: what the Hub (and any registry that reads model
cards) indexes and shows beside the model.

`language`, `license`, `tags`, `datasets`, `metrics`, and a `model-index` with one result per test set: its
sacreBLEU BLEU, chrF and TER, each with its signature (as the metric's `args`, so the score says how it was
computed). The values are metrics/eval.json's, unrounded further.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.params import Params
from pipeline.run_figures import ScoredTestSet

# (metrics/eval.json key, Hugging Face metric id, display name)
METRICS = (("bleu", "bleu", "BLEU"), ("chrf", "chrf", "chrF"), ("ter", "ter", "TER"))


def model_name(params: Params) -> str:
    return params.card.name or f"mtpipe-{params.data.src_lang}-{params.data.tgt_lang}"


def datasets(params: Params, manifest: dict[str, Any]) -> list[str]:
    """Hub ids of the training data: the download's own (wmt14) and those card.datasets names, once each."""
    ids = ([manifest["dataset"]] if manifest.get("dataset") else []) + list(params.card.datasets)
    return list(dict.fromkeys(ids))


def _result(scored: ScoredTestSet, params: Params, manifest: dict[str, Any]) -> dict[str, Any]:
    src, tgt = params.data.src_lang, params.data.tgt_lang
    dataset: dict[str, Any] = {"name": scored.test_set, "type": manifest.get("dataset") or scored.test_set}
    if manifest.get("revision"):
        dataset["revision"] = manifest["revision"]
    metrics = []
    for key, metric_id, display in METRICS:
        value = getattr(scored, key)
        if value is None:
            continue
        entry: dict[str, Any] = {"type": metric_id, "value": value, "name": f"{display} ({scored.test_set})"}
        if key in scored.signatures:
            entry["args"] = {"signature": scored.signatures[key]}
        metrics.append(entry)
    return {"task": {"type": "translation", "name": f"Translation {src}-{tgt}"}, "dataset": dataset,
            "metrics": metrics}


def card_metadata(params: Params, scored: list[ScoredTestSet], manifest: dict[str, Any]) -> dict[str, Any]:
    """The metadata mapping (written as the card's YAML front matter)."""
    metadata: dict[str, Any] = {
        "language": [params.data.src_lang, params.data.tgt_lang],
        "license": params.card.license,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": ["translation", "marian", "mtpipe", f"{params.data.src_lang}-{params.data.tgt_lang}"],
        "datasets": datasets(params, manifest),
        "metrics": [metric_id for _, metric_id, _ in METRICS],
    }
    base = params.model.name_or_path
    # The Hub takes a hub id there; a checkpoint from a local directory is named in the card's text only.
    if params.model.init == "pretrained" and base and not Path(base).exists():
        metadata["base_model"] = base
    metadata["model-index"] = [{"name": model_name(params),
                                "results": [_result(s, params, manifest) for s in scored]}]
    return metadata
