"""The card stage: models/release holds the trained model and a Hugging Face model card whose metadata parses and
says what metrics/eval.json says, and whose text carries the run's data, training and export figures."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.artifacts import Paths, read_json, write_json
from pipeline.errors import MissingArtifact
from pipeline.params import parse
from stages import card

SIGNATURES = {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
              "chrf": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
              "ter": "nrefs:1|case:mixed|tok:tercom|norm:no|punct:yes|asian:no|version:2.6.0"}
EVAL = {
    "newstest2014": {"bleu": 27.31, "chrf": 56.2, "ter": 60.5, "length_ratio": 0.987, "sentences": 3003,
                     "seconds": 80.1, "signature": SIGNATURES},
    "flickr2017": {"bleu": 31.5, "chrf": 60.01, "ter": 50.25, "length_ratio": 1.012, "sentences": 1000,
                   "seconds": 20.0, "signature": {"bleu": "b", "chrf": "c", "ter": "t"}},
}
TRAIN = {"steps": 1200, "epochs": 9, "stop_reason": "max_steps", "train_seconds": 287.4, "parameters": 363072,
         "processes": 2, "device": "cuda", "precision": "bf16", "tgt_tokens_per_s": 15800.5, "best_valid_loss": 3.21,
         "best_valid_bleu": 24.7, "final_model": "best valid loss, update 1000"}
EXPORT = {"n_sentences": 64, "onnx": {"encoder_max_abs_diff": 7e-7, "decoder_max_abs_diff": 4e-7},
          "torchscript": {"encoder_max_abs_diff": 0.0}, "identical_share": 1.0, "bleu": {"delta": 0.0},
          "onnx_int8": {"identical_share": 0.875, "bleu_delta": -0.12}}
MANIFEST = {"source": "files", "src_lang": "en", "tgt_lang": "de",
            "splits": {"train": 29000, "valid": 1014, "newstest2014": 3003, "flickr2017": 1000},
            "inputs": {"/somewhere/on/a/machine/train.en.gz": "ab" * 32}}
CLEAN = {"splits": {"train": {"input": 29000, "kept": 28612, "rejected": 388,
                              "reasons": {"duplicate": 301, "length_ratio": 87}},
                    "valid": {"input": 1014, "kept": 1014, "rejected": 0, "reasons": {}}}}


def project(root: Path, model_dir: Path, manifest: dict = MANIFEST) -> Paths:
    paths = Paths(root)
    shutil.copytree(model_dir, paths.final_model)
    for name, content in (("eval", EVAL), ("train", TRAIN), ("export", EXPORT), ("clean", CLEAN)):
        write_json(paths.metrics(name), content)
    write_json(paths.raw / "manifest.json", manifest)
    return paths


@pytest.fixture(scope="module")
def released(tiny_model_dir, tmp_path_factory) -> tuple[Paths, dict]:
    paths = project(tmp_path_factory.mktemp("card"), tiny_model_dir)
    summary = card.run(parse({"card": {"license": "cc-by-4.0"}}), paths)
    return paths, summary


def front_matter(readme: Path) -> tuple[dict, str]:
    text = readme.read_text(encoding="utf-8")
    match = re.match(r"---\n(.*?)\n---\n(.*)", text, re.DOTALL)
    assert match, "README.md does not start with YAML metadata between --- lines"
    return yaml.safe_load(match.group(1)), match.group(2)


def test_the_card_metadata_parses_and_matches_eval_json(released):
    paths, _ = released
    metadata, _ = front_matter(paths.release / "README.md")
    eval_json = read_json(paths.metrics("eval"))
    assert metadata["language"] == ["en", "de"]
    assert metadata["license"] == "cc-by-4.0"
    assert {"translation", "marian"} <= set(metadata["tags"])
    assert metadata["metrics"] == ["bleu", "chrf", "ter"] and metadata["datasets"] == []
    (model,) = metadata["model-index"]
    assert model["name"] == "mtpipe-en-de"
    assert [r["dataset"]["name"] for r in model["results"]] == list(eval_json)
    for result in model["results"]:
        scores = eval_json[result["dataset"]["name"]]
        assert result["task"]["type"] == "translation"
        shown = {m["type"]: (m["value"], m["args"]["signature"]) for m in result["metrics"]}
        assert shown == {name: (scores[name], scores["signature"][name]) for name in ("bleu", "chrf", "ter")}


def test_huggingface_hub_reads_every_score_of_the_card(released):
    from huggingface_hub import ModelCard

    paths, _ = released
    data = ModelCard.load(paths.release / "README.md").data
    results = {(r.dataset_name, r.metric_type): r.metric_value for r in data.eval_results}
    assert results == {(split, name): EVAL[split][name] for split in EVAL for name in ("bleu", "chrf", "ter")}
    assert data.license == "cc-by-4.0" and data.language == ["en", "de"]


def test_the_release_holds_the_models_files_unchanged_and_leaves_models_final_alone(released):
    paths, summary = released
    release = paths.release
    model_files = sorted(p.name for p in paths.final_model.iterdir())
    assert sorted(p.name for p in release.iterdir()) == sorted([*model_files, "README.md"])
    for name in model_files:
        assert (release / name).read_bytes() == (paths.final_model / name).read_bytes()
        # hard links on one filesystem: the bytes are stored once
        assert os.path.samefile(release / name, paths.final_model / name)
    assert "README.md" not in model_files
    assert summary == {"model_files": len(model_files), "test_sets": 2, "license": "cc-by-4.0"}


def test_the_card_text_gives_data_training_and_export_figures(released):
    paths, _ = released
    _, body = front_matter(paths.release / "README.md")
    assert "| newstest2014 | 3003 | 27.31 | 56.20 | 60.50 | 0.987 |" in body
    assert EVAL["newstest2014"]["signature"]["ter"] in body
    assert "| train | 29000 | 28612 | 388 | duplicate 301, length_ratio 87 |" in body
    assert "`train.en.gz`" in body and "/somewhere/on/a/machine" not in body  # the file, not where it lay
    assert "4.8 min on 2 x cuda, bf16" in body and "1200 (9 epochs), stopped by max_steps" in body
    assert "363,072" in body and "preset `tiny`: d_model 64" in body
    assert "| greedy outputs identical | 100.0% |" in body and "| int8: corpus BLEU difference | -0.12 |" in body
    for usage in ("AutoModelForSeq2SeqLM", "model.generate(", "mtpipe translate --model models/export",
                  "ctranslate2.Translator"):
        assert usage in body, usage


def test_the_cards_transformers_snippet_translates_with_the_release(released):
    paths, _ = released
    _, body = front_matter(paths.release / "README.md")
    snippet = re.search(r"```python\n(.*?)```", body, re.DOTALL).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], cwd=paths.root, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("['")  # one decoded sentence (the model is untrained: any text)


def test_wmt14_data_names_its_dataset_and_revision(tiny_model_dir, tmp_path):
    manifest = {**MANIFEST, "source": "wmt14", "dataset": "wmt/wmt14", "revision": "b199e40"}
    paths = project(tmp_path, tiny_model_dir, manifest)
    card.run(parse({"card": {"datasets": ["wmt/wmt14", "my-org/extra"], "name": "my-en-de"}}), paths)
    metadata, body = front_matter(paths.release / "README.md")
    assert metadata["datasets"] == ["wmt/wmt14", "my-org/extra"]
    assert metadata["model-index"][0]["name"] == "my-en-de"
    assert metadata["model-index"][0]["results"][0]["dataset"] == {"name": "newstest2014", "type": "wmt/wmt14",
                                                                  "revision": "b199e40"}
    assert body.startswith("\n# my-en-de\n") and "WMT14 (wmt/wmt14, revision b199e40)" in body


@pytest.mark.parametrize(("missing", "stage"), [("metrics/eval.json", "evaluate"), ("metrics/export.json", "export"),
                                                ("data/raw/manifest.json", "download")])
def test_a_missing_input_names_the_stage_that_writes_it(tiny_model_dir, tmp_path, missing, stage):
    paths = project(tmp_path, tiny_model_dir)
    (tmp_path / missing).unlink()
    with pytest.raises(MissingArtifact, match=f"produced by the '{stage}' stage"):
        card.run(parse({}), paths)
    assert not paths.release.exists()


def test_the_license_must_be_a_hub_license_id():
    from pipeline.params import ParamsError

    with pytest.raises(ParamsError, match="card.license"):
        parse({"card": {"license": "All rights reserved"}})
