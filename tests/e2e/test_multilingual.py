"""Two directions in one model through the real DAG, on a Multi30k slice: `dvc exp run -S data.directions=[...]`.

The project starts as a one-direction (en-de) params file; the experiment adds en-fr with nothing but `-S`, the
way a user would. One file per language (`{pattern: .../<split>.{lang}.gz}`) feeds both directions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.runtime.model_languages import ModelLanguages
from tests.conftest import multi30k_lines
from tests.e2e.helpers import (
    STUDENT_STAGES,
    TEACHER_STAGES,
    dvc,
    git,
    multi30k_per_language,
    project_copy,
    set_params,
    teacher_and_student_stages,
)

pytestmark = pytest.mark.e2e
SPLITS = {"train": ("train", 4000), "valid": ("val", 200), "test_2016_flickr": ("test_2016_flickr", 200)}
DIRECTIONS = ["en-de", "en-fr"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    corpus = tmp_path_factory.mktemp("multi30k")
    files = multi30k_per_language(corpus, SPLITS, ("en", "de", "fr"))
    root = project_copy(tmp_path_factory.mktemp("project"))
    set_params(
        root,
        {
            "data": {
                "source": "files",
                "directions": ["en-de"],
                "files": files,
            },
            "tokenize": {"vocab_size": 2000},
            "model": {"preset": "tiny", "dropout": 0.1},
            "train": {"max_steps": 300, "max_minutes": 10, "lr": 0.003, "warmup_steps": 150, "max_tokens": 4096,
                      "valid_every": 150, "save_every": 150, "valid_bleu_sentences": 50},
            "export": {"parity_sentences": 16, "int8": False, "torchscript": False},
        },
    )
    git(root, "commit", "-qam", "multi30k slice, en-de")
    result = dvc(root, "exp", "run", "-S", "data.directions=[en-de,en-fr]")
    assert teacher_and_student_stages(result) == (TEACHER_STAGES, STUDENT_STAGES)
    return root


def read(project: Path, path: str):
    return json.loads((project / path).read_text())


def test_every_row_keeps_its_direction_and_none_is_lost(project):
    manifest = read(project, "data/raw/manifest.json")
    assert manifest["directions"] == DIRECTIONS
    assert manifest["rows_per_direction"] == {split: dict.fromkeys(DIRECTIONS, n) for split, (_, n) in SPLITS.items()}
    clean = read(project, "metrics/clean.json")["directions"]
    for direction in DIRECTIONS:
        for split, (_, n) in SPLITS.items():
            counts = clean[direction][split]
            assert counts["kept"] + counts["rejected"] == counts["input"] == n


def test_each_source_starts_with_its_target_tag(project):
    meta = read(project, "data/tokenized/meta.json")
    languages = ModelLanguages.read(project / "data/tokenized/hf_tokenizer")
    assert languages.directions.names == DIRECTIONS and languages.target_tags is True
    vocab = read(project, "models/final/vocab.json")
    tags = np.array([vocab[">>de<<"], vocab[">>fr<<"]])
    offsets = np.load(project / "data/tokenized/valid.src.idx.npy")
    tokens = np.fromfile(project / "data/tokenized/valid.src.bin", dtype=meta["dtype"])
    directions = np.load(project / "data/tokenized/valid.dir.npy")
    assert np.bincount(directions).tolist() == [200, 200]
    assert (tokens[offsets[:-1]] == tags[directions]).all()


def test_metrics_have_one_column_per_direction_and_test_set(project):
    shown = dvc(project, "metrics", "show", "--json").stdout
    assert "test_2016_flickr" in shown
    scores = read(project, "metrics/eval.json")
    per_direction = [scores["test_2016_flickr"][d]["bleu"] for d in DIRECTIONS]
    assert scores["macro"]["bleu"] == pytest.approx(sum(per_direction) / 2, abs=0.01)
    columns = dvc(project, "exp", "show", "--csv").stdout.splitlines()[0].split(",")
    for direction in DIRECTIONS:
        assert f"test_2016_flickr.{direction}.bleu" in columns
    assert "macro.bleu" in columns
    live = read(project, "dvclive/metrics.json")
    assert {"en-de", "en-fr"} <= set(live["valid"])


def _translate(project: Path, lines: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "mtpipe"), "translate", "--model", str(project / "models/export"), *args],
        input="\n".join(lines) + "\n", capture_output=True, text=True,
    )


def test_translate_writes_the_target_asked_for_and_names_the_choices_when_none_is(project):
    import py3langid

    sources = multi30k_lines("test_2016_flickr", "en", 40)[-30:]
    for tgt in ("de", "fr"):
        result = _translate(project, sources, "--tgt", tgt)
        assert result.returncode == 0, result.stderr
        hypotheses = result.stdout.splitlines()
        assert len(hypotheses) == len(sources)
        assert py3langid.classify(" ".join(hypotheses))[0] == tgt
    missing = _translate(project, sources[:2])
    assert missing.returncode != 0
    assert "de, fr" in missing.stderr
    unknown = _translate(project, sources[:2], "--tgt", "cs")
    assert unknown.returncode != 0 and "de, fr" in unknown.stderr
