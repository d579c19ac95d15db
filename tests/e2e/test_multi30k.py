"""The real DAG on real data: a Multi30k subset through `data.source: files`, read from ../shared/data/multi30k.

A training loop that is broken (no gradient, wrong labels, shifted targets, a tokenizer mismatch) cannot beat
the same model untrained by 5 BLEU, so this is the end-to-end check that learning happens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import multi30k_lines
from tests.e2e.helpers import (
    STUDENT_STAGES,
    TEACHER_STAGES,
    dvc,
    git,
    project_copy,
    set_params,
    teacher_and_student_stages,
    write_gz,
)

pytestmark = pytest.mark.e2e
TRAIN_PAIRS = 12_000
TEST_PAIRS = 500


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    corpus = tmp_path_factory.mktemp("multi30k")
    subsets = {
        "train": ("train", TRAIN_PAIRS),
        "valid": ("val", 500),
        "test_2016_flickr": ("test_2016_flickr", TEST_PAIRS),
    }
    files = {
        split: {
            side: write_gz(corpus / f"{split}.{lang}.gz", multi30k_lines(name, lang, n))
            for side, lang in (("src", "en"), ("tgt", "de"))
        }
        for split, (name, n) in subsets.items()
    }
    root = project_copy(tmp_path_factory.mktemp("project"))
    set_params(
        root,
        {
            "data": {"source": "files", "files": files},
            "tokenize": {"vocab_size": 4000},
            "model": {"preset": "tiny", "dropout": 0.1},
            "train": {
                "max_steps": 350,
                "max_minutes": 10,
                "lr": 0.003,
                "warmup_steps": 200,
                "max_tokens": 4096,
                "valid_every": 350,
            },
            "export": {"parity_sentences": 32},
        },
    )
    git(root, "commit", "-qam", "multi30k subset")
    result = dvc(root, "repro")
    assert teacher_and_student_stages(result) == (TEACHER_STAGES, STUDENT_STAGES)
    return root


def test_download_keeps_every_row_with_its_origin(project):
    manifest = json.loads((project / "data/raw/manifest.json").read_text())
    assert manifest["splits"] == {"train": TRAIN_PAIRS, "valid": 500, "test_2016_flickr": TEST_PAIRS}
    clean = json.loads((project / "metrics/clean.json").read_text())
    for split, counts in clean["splits"].items():
        assert counts["kept"] + counts["rejected"] == counts["input"] == manifest["splits"][split]


def test_trained_model_beats_the_untrained_one_by_5_bleu(project):
    from pipeline.corpus import read_pairs
    from pipeline.params import load
    from pipeline.runtime.model_languages import ModelLanguages
    from stages.evaluate import score, translate
    from stages.train.model import build_model

    trained = json.loads((project / "metrics/eval.json").read_text())["test_2016_flickr"]["en-de"]
    params = load(project / "params.yaml")
    meta = json.loads((project / "data/tokenized/meta.json").read_text())
    untrained = build_model(params.model, meta["vocab_size"], meta["pad_id"], meta["eos_id"], seed=params.train.seed)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(project / "models/final")
    sources, refs = read_pairs(project / "data/clean/test_2016_flickr.parquet")
    layout = ModelLanguages.read(project / "models/final").layout("en-de")
    baseline = score(translate(untrained, tokenizer, layout, sources, params.evaluate), refs)
    print(f"trained BLEU {trained['bleu']:.2f} vs untrained {baseline['bleu']:.2f}")
    assert trained["bleu"] >= baseline["bleu"] + 5


def test_export_parity_holds_on_the_trained_model(project):
    report = json.loads((project / "metrics/export.json").read_text())
    assert report["identical_share"] >= 0.99
    assert report["onnx"]["decoder_max_abs_diff"] <= 1e-4
    assert abs(report["bleu"]["delta"]) <= 0.1
    assert report["bleu"]["pytorch"] > 5  # greedy output of a model that learned something
