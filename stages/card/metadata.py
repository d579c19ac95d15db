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

from pipeline.params import Params
from pipeline.run_figures import ScoredTestSet
from pipeline.runtime.languages import Direction, Directions

# (metrics/eval.json key, Hugging Face metric id, display name)
METRICS = (("bleu", "bleu", "BLEU"), ("chrf", "chrf", "chrF"), ("ter", "ter", "TER"))


def model_name(params: Params, directions: Directions, student: bool = False) -> str:
    """card.name, or mtpipe-<its languages>: mtpipe-en-de, mtpipe-en-de-fr-cs; a distilled student's with
    `-student` after it."""
    name = params.card.name or f"mtpipe-{'-'.join(directions.languages)}"
    return f"{name}-student" if student else name


def hub_dataset(manifest: dict[str, Any]) -> str | None:
    """The Hub id the data was downloaded from; None for other data, a local copy of a Hub dataset included."""
    return None if manifest.get("dataset_is_local") else manifest.get("dataset")


def datasets(params: Params, manifest: dict[str, Any]) -> list[str]:
    """Hub ids of the training data: the download's own (data.source hub, wmt14) and those card.datasets names,
    once each."""
    own = hub_dataset(manifest)
    return list(dict.fromkeys(([own] if own else []) + list(params.card.datasets)))


# A result's dataset `type` is a Hub dataset id where the data has one; data from elsewhere is named by where it
# came from instead (the test set's own name is in the result's `name`). `datasets` lists Hub ids only: anything
# else there would be a broken link on the Hub.
LOCAL_DATA = {"sample": "mtpipe-embedded-sample", "files": "local-files"}


def dataset_type(manifest: dict[str, Any]) -> str:
    """The Hub id of the data (wmt/wmt14), else what the data was: the embedded sample or local files."""
    if hub_dataset(manifest):
        return str(manifest["dataset"])
    if manifest.get("dataset_is_local"):
        return "local-files"
    source = str(manifest.get("source") or "files")
    return LOCAL_DATA.get(source, source)


def direction_of(scored: ScoredTestSet, directions: Directions) -> Direction:
    """The entry's direction; an eval.json from before directions scored the model's one direction."""
    return Direction.parse(scored.direction) if scored.direction else directions.directions[0]


def dataset_config(direction: Direction, manifest: dict[str, Any]) -> str:
    """The `load_dataset` config the pair came from, as the download recorded it (WMT14's de-en serves en-de);
    data without configurations has none, and the direction stands in."""
    return str(manifest.get("configs", {}).get(str(direction), direction))


def _result(scored: ScoredTestSet, directions: Directions, manifest: dict[str, Any]) -> dict[str, Any]:
    direction = direction_of(scored, directions)
    dataset: dict[str, Any] = {"name": f"{scored.test_set} {direction}",
                               "type": dataset_type(manifest),
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


def card_metadata(params: Params, directions: Directions, scored: list[ScoredTestSet], manifest: dict[str, Any],
                  model_type: str) -> dict[str, Any]:
    """The metadata mapping (written as the card's YAML front matter) of a model of these `directions` (its
    languages.json's); `model_type` (config.json's: marian, mbart, m2m_100) is the architecture's tag, as the Hub
    tags checkpoints."""
    pairs = directions
    metadata: dict[str, Any] = {
        "language": pairs.languages,
        "license": params.card.license,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": ["translation", model_type, "mtpipe", *pairs.names,
                 *(["knowledge-distillation", "student"] if "distillation" in manifest else [])],
        "datasets": datasets(params, manifest),
        "metrics": [metric_id for _, metric_id, _ in METRICS],
    }
    base = params.model.name_or_path
    # The Hub takes a hub id there; a checkpoint from a local directory is named in the card's text only.
    if params.model.init == "pretrained" and base and not Path(base).exists():
        metadata["base_model"] = base
    metadata["model-index"] = [{"name": model_name(params, directions, "distillation" in manifest),
                                "results": [_result(s, directions, manifest) for s in scored]}]
    return metadata
