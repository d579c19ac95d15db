"""card: the release directory, the trained model with its model card (Hugging Face format) as README.md.

The card needs the evaluate and export stages' figures, but `models/final` is the train stage's output and DVC
lets one stage only write into a directory. So this stage, after evaluate and export, writes `models/release/`:
the files of `models/final` (hard links where the filesystem allows, else copies; DVC's cache stores identical
content once, and checks both directories out as links to it: .dvc/config's cache.type) and `README.md`. That
directory is what goes to the Hugging Face Hub or a model registry: `hf upload <repo> models/release`.

The languages, directions, family and codes come from the model's record (models/final/languages.json); the scores
from metrics/eval.json, one entry per test set and direction; a fine-tuned checkpoint's sizes from its config.json.

- metadata.py: the card's YAML metadata (language, license, tags, datasets, metrics, model-index with each test
  set's and direction's scores and signatures), from metrics/eval.json and params.
- body.py: the card's text, from metrics/{eval,train,export,clean}.json, data/raw/manifest.json and params.
- checkpoint.py: the fine-tuned checkpoint (model.init: pretrained): family, architecture, language codes, and how
  its family is asked for a target language.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, link_or_copy, read_json
from pipeline.errors import MissingArtifact
from pipeline.params import Params
from pipeline.run_figures import export_parity, read_evaluation, training_run
from pipeline.runtime.model_languages import ModelLanguages
from stages.card.body import CardInputs, card_body
from stages.card.checkpoint import read_checkpoint
from stages.card.metadata import card_metadata

CARD_FILE = "README.md"


def link_or_copy_tree(source_dir: Path, target_dir: Path) -> int:
    """Every file of `source_dir` into `target_dir` (made), hard-linked where possible; returns the file count."""
    target_dir.mkdir(parents=True)
    files = sorted(p for p in source_dir.rglob("*") if p.is_file())
    for source in files:
        target = target_dir / source.relative_to(source_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(source, target)
    return len(files)


def read_inputs(params: Params, paths: Paths) -> CardInputs:
    """What the card shows, each file checked to exist first (a missing one names the stage that writes it)."""
    required = {paths.final_model / "config.json": "train", paths.metrics("train"): "train",
                paths.metrics("eval"): "evaluate", paths.metrics("export"): "export",
                paths.raw / "manifest.json": "download", paths.metrics("clean"): "clean"}
    for path, stage in required.items():
        if not path.is_file():
            raise MissingArtifact(path, stage)
    languages = ModelLanguages.read(paths.final_model)
    training, parity, evaluation = training_run(paths), export_parity(paths), read_evaluation(paths)
    assert training is not None and parity is not None and evaluation is not None  # the files exist
    return CardInputs(params=params, evaluation=evaluation, training=training, parity=parity,
                      manifest=read_json(paths.raw / "manifest.json"), clean=read_json(paths.metrics("clean")),
                      model_config=read_json(paths.final_model / "config.json"), languages=languages,
                      checkpoint=read_checkpoint(paths.final_model, languages)
                      if params.model.init == "pretrained" else None)


def card_text(card: CardInputs) -> str:
    """The whole README.md: YAML metadata between `---` lines, then the markdown."""
    import yaml

    metadata = yaml.safe_dump(card_metadata(card.params, card.languages.directions, card.evaluation.scored,
                                            card.manifest, card.model_config.get("model_type", "marian")),
                              sort_keys=False, allow_unicode=True, width=1000)
    return f"---\n{metadata}---\n\n{card_body(card)}"


def run(params: Params, paths: Paths) -> dict[str, Any]:
    card = read_inputs(params, paths)
    with atomic_path(paths.release) as out:
        files = link_or_copy_tree(paths.final_model, out)
        # Unlinked first: were the model directory ever to hold a README.md, writing through its hard link would
        # change models/final too.
        (out / CARD_FILE).unlink(missing_ok=True)
        (out / CARD_FILE).write_text(card_text(card), encoding="utf-8")
    return {"model_files": files, "results": len(card.evaluation.scored), "license": params.card.license}
