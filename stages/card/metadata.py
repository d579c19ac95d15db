"""The model card's YAML metadata, in the Hugging Face format: what the Hub (and any registry that reads model
cards) indexes and shows beside the model.

`language` (every language of data.directions), `license`, `tags` (the architecture's model_type, and one per
direction), `base_model` (a fine-tuned hub checkpoint), `datasets`, `metrics`, and a `model-index` with one result
per test set and direction: its language pair in `task.name` and in the dataset's name (and `config`: the WMT14
config, e.g. de-en, or else the direction), its sacreBLEU BLEU, chrF and TER, each with its signature (as the
metric's `args`, so the score says how it was computed). The values are metrics/eval.json's, unrounded further.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.languages import Direction
from pipeline.params import Params
from pipeline.run_figures import ScoredTestSet

# (metrics/eval.json key, Hugging Face metric id, display name)
METRICS = (("bleu", "bleu", "BLEU"), ("chrf", "chrf", "chrF"), ("ter", "ter", "TER"))


def model_name(params: Params) -> str:
    """card.name, or mtpipe-<its languages>: mtpipe-en-de, mtpipe-en-de-fr-cs."""
    return params.card.name or f"mtpipe-{'-'.join(params.data.pairs.languages)}"


def datasets(params: Params, manifest: dict[str, Any]) -> list[str]:
    """Hub ids of the training data: the download's own (wmt14) and those card.datasets names, once each."""
    ids = ([manifest["dataset"]] if manifest.get("dataset") else []) + list(params.card.datasets)
    return list(dict.fromkeys(ids))


def direction_of(scored: ScoredTestSet, params: Params) -> Direction:
    """The entry's direction; an eval.json from before directions scored the model's one direction."""
    return Direction.parse(scored.direction) if scored.direction else params.data.pairs.directions[0]


def dataset_config(direction: Direction, manifest: dict[str, Any]) -> str:
    """The `load_dataset` config the pair comes from: WMT14 names its pairs xx-en, whichever way they are
    translated (stages/download.py reads them so); other data has none, the direction stands in."""
    if manifest.get("source") == "wmt14":
        other = direction.tgt if direction.src == "en" else direction.src
        return f"{other}-en"
    return str(direction)


def _result(scored: ScoredTestSet, params: Params, manifest: dict[str, Any]) -> dict[str, Any]:
    direction = direction_of(scored, params)
    dataset: dict[str, Any] = {"name": f"{scored.test_set} {direction}",
                               "type": manifest.get("dataset") or scored.test_set,
                               "config": dataset_config(direction, manifest)}
    if manifest.get("revision"):
        dataset["revision"] = manifest["revision"]
    metrics = []
    for key, metric_id, display in METRICS:
        value = getattr(scored, key)
        if value is None:
            continue
        entry: dict[str, Any] = {"type": metric_id, "value": value, "name": f"{display} ({dataset['name']})"}
        if key in scored.signatures:
            entry["args"] = {"signature": scored.signatures[key]}
        metrics.append(entry)
    return {"task": {"type": "translation", "name": f"Translation {direction}"}, "dataset": dataset,
            "metrics": metrics}


def card_metadata(params: Params, scored: list[ScoredTestSet], manifest: dict[str, Any],
                  model_type: str) -> dict[str, Any]:
    """The metadata mapping (written as the card's YAML front matter); `model_type` (config.json's: marian, mbart,
    m2m_100) is the architecture's tag, as the Hub tags checkpoints."""
    pairs = params.data.pairs
    metadata: dict[str, Any] = {
        "language": pairs.languages,
        "license": params.card.license,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": ["translation", model_type, "mtpipe", *pairs.names],
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
