"""The card stage: models/release holds the trained model and a Hugging Face model card whose metadata parses and
says what metrics/eval.json says (one result per test set and direction), and whose text carries the run's data,
training and export figures; with several directions, every language, each direction's scores and data, and the
target tag in the usage."""

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
from pipeline.runtime.languages import Directions
from stages import card
from tests.support.run_files import EVAL, EVAL_MULTI, EXPORT, TRAIN
from tests.support.tagged_model import tagged_tiny_model

pytestmark = pytest.mark.e2e

MANIFEST = {"source": "files", "directions": ["en-de"],
            "splits": {"train": 29000, "valid": 1014, "newstest2014": 3003, "flickr2017": 1000},
            "rows_per_direction": {"train": {"en-de": 29000}, "valid": {"en-de": 1014},
                                   "newstest2014": {"en-de": 3003}, "flickr2017": {"en-de": 1000}},
            "inputs": {"/somewhere/on/a/machine/train.en.gz": "ab" * 32}}
CLEAN = {"splits": {"train": {"input": 29000, "kept": 28612, "rejected": 388,
                              "reasons": {"duplicate": 301, "length_ratio": 87}},
                    "valid": {"input": 1014, "kept": 1014, "rejected": 0, "reasons": {}}}}


def project(root: Path, model_dir: Path, manifest: dict = MANIFEST, evaluation: dict = EVAL,
            clean: dict = CLEAN) -> Paths:
    paths = Paths(root)
    shutil.copytree(model_dir, paths.final_model)
    for name, content in (("eval", evaluation), ("train", TRAIN), ("export", EXPORT), ("clean", clean)):
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
    assert [r["dataset"]["name"] for r in model["results"]] == ["newstest2014 en-de", "flickr2017 en-de"]
    for result in model["results"]:
        test_set = result["dataset"]["name"].split()[0]
        scores = eval_json[test_set]["en-de"]
        assert result["task"] == {"type": "translation", "name": "Translation en-de"}
        # Local files have no Hub id: the type says where the data came from, the name which test set it is.
        assert result["dataset"] == {"name": f"{test_set} en-de", "type": "local-files", "config": "en-de"}
        shown = {m["type"]: (m["value"], m["args"]["signature"]) for m in result["metrics"]}
        assert shown == {name: (scores[name], scores["signature"][name]) for name in ("bleu", "chrf", "ter")}


def test_huggingface_hub_reads_every_score_of_the_card(released):
    from huggingface_hub import ModelCard

    paths, _ = released
    data = ModelCard.load(paths.release / "README.md").data
    results = {(r.dataset_name, r.metric_type): r.metric_value for r in data.eval_results}
    assert results == {(f"{split} en-de", name): EVAL[split]["en-de"][name] for split in ("newstest2014", "flickr2017")
                       for name in ("bleu", "chrf", "ter")}
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
    assert summary == {"model_files": len(model_files), "results": 2, "license": "cc-by-4.0"}


def test_the_card_text_gives_data_training_and_export_figures(released):
    paths, _ = released
    _, body = front_matter(paths.release / "README.md")
    assert "| newstest2014 | en-de | 3003 | 27.31 | 56.20 | 60.50 | 0.987 |" in body
    assert "| macro | mean of 2 |  | 29.41 | 58.11 | 55.38 |  |" in body
    assert EVAL["newstest2014"]["en-de"]["signature"]["ter"] in body
    assert "Translates en into de. newstest2014 en-de BLEU 27.31 / chrF 56.20, flickr2017 en-de BLEU 31.50" in body
    assert "en → de pairs from local files." in body and "Per direction" not in body
    assert "| train | 29000 | 28612 | 388 | duplicate 301, length_ratio 87 |" in body
    assert "`train.en.gz`" in body and "/somewhere/on/a/machine" not in body  # the file, not where it lay
    assert "4.8 min on 2 x cuda, bf16" in body and "1200 (9 epochs), stopped by max_steps" in body
    assert "363,072" in body and "preset `tiny`: d_model 64" in body
    assert "| greedy outputs identical | 100.0% |" in body and "| int8: corpus BLEU difference | -0.12 |" in body
    for usage in ("AutoModelForSeq2SeqLM", "model.generate(", "ctranslate2.Translator",
                  "mtpipe translate --model models/export --beam 4 < input.en > output.de"):
        assert usage in body, usage
    assert ">>" not in body and "--tgt" not in body  # one target: no tag to give


def test_the_cards_transformers_snippet_translates_with_the_release(released):
    paths, _ = released
    _, body = front_matter(paths.release / "README.md")
    snippet = re.search(r"```python\n(.*?)```", body, re.DOTALL).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], cwd=paths.root, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("['")  # one decoded sentence (the model is untrained: any text)


def test_the_cards_ctranslate2_snippet_translates_with_the_release_converted_as_it_says(released):
    import ctranslate2

    paths, _ = released
    _, body = front_matter(paths.release / "README.md")
    snippet = re.findall(r"```python\n(.*?)```", body, re.DOTALL)[1]
    assert "# ct2-transformers-converter --model models/release --output_dir ct2" in snippet
    ctranslate2.converters.TransformersConverter(str(paths.release)).convert(str(paths.root / "ct2"), force=True)
    out = subprocess.run([sys.executable, "-c", snippet], cwd=paths.root, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()  # a decoded sentence (the model is untrained: any text)


def test_a_run_cut_short_by_its_time_limit_is_said_first_on_the_card(tiny_model_dir, tmp_path):
    paths = project(tmp_path, tiny_model_dir)
    write_json(paths.metrics("train"), {**TRAIN, "steps": 170, "stop_reason": "max_minutes", "max_steps": 1200,
                                        "max_minutes": 5})
    card.run(parse({}), paths)
    _, body = front_matter(paths.release / "README.md")
    first = [line for line in body.splitlines() if line][:2]
    assert first[1].startswith("> **Warning:** Training was cut short by train.max_minutes (5 min) after 170 of the "
                               "1200 planned steps")



def test_the_card_names_the_attention_and_word_dropout_and_the_sampled_segmentations_where_set(
        released, tiny_model_dir, tmp_path):
    _, plain = front_matter(released[0].release / "README.md")
    assert "attention 0" not in plain and "subword regularization" not in plain and "word dropout" not in plain
    paths = project(tmp_path, tiny_model_dir)
    card.run(parse({"model": {"attention_dropout": 0.1}, "tokenize": {"sampled_copies": 5},
                    "train": {"word_dropout": 0.1}}), paths)
    _, body = front_matter(paths.release / "README.md")
    assert "label smoothing 0.1, clip norm 1.0, word dropout 0.1" in body
    assert "dropout 0.1 (attention 0.1)" in body
    assert ("every training pair also in 5 segmentations sampled from the 64 best (alpha 0.1), decoded with the "
            "one best") in body


def test_the_cards_snippets_decode_with_the_length_penalty_of_its_scores(released, tiny_model_dir, tmp_path):
    _, plain = front_matter(released[0].release / "README.md")
    assert "num_beams=4, length_penalty=1.0," in plain and "beam_size=4, length_penalty=1.0," in plain
    paths = project(tmp_path, tiny_model_dir)
    card.run(parse({"evaluate": {"length_penalty": 1.6, "beam": 5}}), paths)
    _, body = front_matter(paths.release / "README.md")
    assert "num_beams=5, length_penalty=1.6," in body and "beam_size=5, length_penalty=1.6," in body
    assert "min_decoding_length=0)[0].hypotheses[0]" in body


def test_a_run_that_reached_its_planned_steps_has_no_warning_on_its_card(released):
    paths, _ = released
    assert "Warning" not in front_matter(paths.release / "README.md")[1]


def test_wmt14_data_names_its_dataset_and_revision(tiny_model_dir, tmp_path):
    manifest = {**MANIFEST, "source": "wmt14", "dataset": "wmt/wmt14", "revision": "b199e40",
                "configs": {"en-de": "de-en"}}
    paths = project(tmp_path, tiny_model_dir, manifest)
    card.run(parse({"card": {"datasets": ["wmt/wmt14", "my-org/extra"], "name": "my-en-de"}}), paths)
    metadata, body = front_matter(paths.release / "README.md")
    assert metadata["datasets"] == ["wmt/wmt14", "my-org/extra"]
    assert metadata["model-index"][0]["name"] == "my-en-de"
    assert metadata["model-index"][0]["results"][0]["dataset"] == {"name": "newstest2014 en-de", "type": "wmt/wmt14",
                                                                  "config": "de-en", "revision": "b199e40"}
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


# ------------------------------------------------------------------------------------------------ two directions

MULTI = ["en-de", "en-fr"]
MANIFEST_MULTI = {"source": "files", "directions": MULTI, "splits": {"train": 58000, "valid": 2028, "test": 2000},
                  "rows_per_direction": {"train": {"en-de": 29000, "en-fr": 29000},
                                         "valid": {"en-de": 1014, "en-fr": 1014},
                                         "test": {"en-de": 1000, "en-fr": 1000}}}
CLEAN_MULTI = {
    "splits": {"train": {"input": 58000, "kept": 57500, "rejected": 500, "reasons": {"duplicate": 500}},
               "valid": {"input": 2028, "kept": 2028, "rejected": 0, "reasons": {}}},
    "directions": {
        "en-de": {"train": {"input": 29000, "kept": 28700, "rejected": 300}, "valid": {"input": 1014, "kept": 1014,
                  "rejected": 0}, "reasons": {"duplicate": 300}},
        "en-fr": {"train": {"input": 29000, "kept": 28800, "rejected": 200}, "valid": {"input": 1014, "kept": 1014,
                  "rejected": 0}, "reasons": {"duplicate": 200}}},
}


def multi_params(directions: list[str] = MULTI, **sections) -> dict:
    files = {split: {"pattern": f"multi30k/{name}.{{lang}}.gz"}
             for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr"))}
    return parse({"data": {"source": "files", "directions": directions, "files": files}, **sections})


@pytest.fixture(scope="module")
def released_multi(tmp_path_factory) -> Paths:
    root = tmp_path_factory.mktemp("card_multi")
    model_dir = tagged_tiny_model(root / "model", tuple(MULTI), {"train": 200, "valid": 5, "test": 5})
    paths = project(root / "project", model_dir, MANIFEST_MULTI, EVAL_MULTI, CLEAN_MULTI)
    card.run(multi_params(card={"license": "cc-by-4.0"}), paths)
    return paths


def test_a_two_direction_card_names_every_language_and_scores_each_direction(released_multi):
    from huggingface_hub import ModelCard

    metadata, _ = front_matter(released_multi.release / "README.md")
    assert metadata["language"] == ["en", "de", "fr"]
    assert {"en-de", "en-fr"} <= set(metadata["tags"])
    (model,) = metadata["model-index"]
    assert model["name"] == "mtpipe-en-de-fr"
    assert [(r["task"]["name"], r["dataset"]["name"], r["dataset"]["config"]) for r in model["results"]] == [
        ("Translation en-de", "test en-de", "en-de"), ("Translation en-fr", "test en-fr", "en-fr")]
    data = ModelCard.load(released_multi.release / "README.md").data
    results = {(r.dataset_name, r.metric_type): r.metric_value for r in data.eval_results}
    assert results == {(f"test {d}", name): EVAL_MULTI["test"][d][name]
                       for d in MULTI for name in ("bleu", "chrf", "ter")}


def test_a_two_direction_card_text_gives_each_directions_scores_and_data_and_the_target_tag(released_multi):
    _, body = front_matter(released_multi.release / "README.md")
    assert "Translates en into de and fr." in body and "macro BLEU 35.31 / chrF 61.78." in body
    assert "| test | en-de | 1000 | 30.12 | 58.30 | 52.00 | 0.990 |" in body
    assert "| test | en-fr | 1000 | 40.50 | 65.25 | 41.50 | 1.010 |" in body
    assert "| macro | mean of 2 |  | 35.31 | 61.78 | 46.75 |  |" in body
    assert "en → de, en → fr pairs from local files." in body
    assert "| en-fr | train | 29000 | 28800 | 200 | duplicate 200 |" in body
    assert "| en-de | valid | 1014 | 1014 | 0 |  |" in body
    assert "one model for all 3 languages" in body
    assert "each source starts with its target's tag (>>de<<, >>fr<<)" in body
    assert "mtpipe translate --model models/export --tgt de --beam 4 < input.en > output.de" in body
    assert 'tokenizer([">>de<< The weather is nice today."]' in body
    assert 'tokenizer.encode(">>de<< The weather is nice today.")' in body


def test_a_two_direction_cards_snippet_translates_with_the_tagged_release(released_multi):
    _, body = front_matter(released_multi.release / "README.md")
    snippet = re.search(r"```python\n(.*?)```", body, re.DOTALL).group(1)
    # The tag is one token of the release's own tokenizer, not pieces of it.
    check = 'print(tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())[0])'
    out = subprocess.run([sys.executable, "-c", f"{snippet}\n{check}"], cwd=released_multi.root, capture_output=True,
                         text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr
    decoded, first_token = out.stdout.splitlines()
    assert decoded.startswith("['") and first_token == ">>de<<"


def test_the_default_name_joins_every_language_once():
    def name(directions: list[str]) -> str:
        return card.metadata.model_name(parse({}), Directions.of(directions))

    assert name(["en-de", "en-fr", "en-cs"]) == "mtpipe-en-de-fr-cs"
    assert name(["en-de"]) == "mtpipe-en-de"
    assert name(["en-de", "de-en"]) == "mtpipe-en-de"


def test_a_results_dataset_type_is_the_hub_id_or_says_where_the_data_came_from():
    from stages.card.metadata import dataset_type

    assert dataset_type({"source": "wmt14", "dataset": "wmt/wmt14"}) == "wmt/wmt14"
    assert dataset_type({"source": "sample"}) == "mtpipe-embedded-sample"
    assert dataset_type({"source": "files"}) == "local-files"
