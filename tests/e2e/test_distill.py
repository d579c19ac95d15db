"""Distillation through the real DAG on a two-direction Multi30k slice: a tiny teacher, its export translating the
training sources, and a smaller student trained, evaluated, exported and carded on its translations.

The teacher trains only a few hundred steps, so its translations are rough and some fail the filters: what matters
here is the accounting (every teacher output kept or rejected with a reason), the student's own artifacts, and which
stages a change reruns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.e2e.helpers import (
    STUDENT_STAGES,
    TEACHER_STAGES,
    dvc,
    git,
    multi30k_per_language,
    project_copy,
    set_params,
    stages_run,
)

pytestmark = pytest.mark.e2e
SPLITS = {"train": ("train", 1500), "valid": ("val", 100), "test_2016_flickr": ("test_2016_flickr", 100)}
DIRECTIONS = ["en-de", "en-fr"]
TRAIN = {"max_steps": 200, "lr": 0.003, "warmup_steps": 100, "max_tokens": 4096, "valid_every": 100,
         "save_every": 100, "valid_bleu_sentences": 20}
SMALL = {"export": {"parity_sentences": 16, "torchscript": False},
         # The rough teacher's German is often too short for the language check to find it German.
         "validate": {"language_sample": 0}}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    corpus = tmp_path_factory.mktemp("multi30k")
    files = multi30k_per_language(corpus, SPLITS, ("en", "de", "fr"))
    root = project_copy(tmp_path_factory.mktemp("project"))
    set_params(root, {
        "data": {"source": "files", "directions": DIRECTIONS, "files": files},
        "tokenize": {"vocab_size": 1000},
        "model": {"preset": "tiny", "dropout": 0.1},
        "train": TRAIN,
        **SMALL,
    })
    set_distill(root, {"enabled": True, "beam": 2, "original_ratio": 0.2},
                tokenize={"vocab_size": 800},
                model={"preset": "tiny", "d_model": 32, "ffn_dim": 128, "encoder_layers": 2, "decoder_layers": 1,
                       "attention_heads": 4},
                train={**TRAIN, "max_steps": 100, "valid_every": 50, "save_every": 50},
                export=SMALL["export"])  # with the student's shortlist, on by default
    git(root, "commit", "-qam", "multi30k slice, two directions, distilled")
    ran = stages_run(dvc(root, "repro"))
    assert sorted(ran) == sorted(TEACHER_STAGES + STUDENT_STAGES)
    assert [s for s in ran if s in STUDENT_STAGES] == STUDENT_STAGES and ran.index("distill") > ran.index("export")
    return root


def set_distill(root: Path, settings: dict, **blocks: dict) -> None:
    """Change keys of params.yaml's distill section and of its student blocks, keeping every other key: DVC needs
    each param a stage declares to be in the file."""
    params = read_params(root)
    params["distill"].update(settings)
    for block, values in blocks.items():
        params["distill"][block].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def read(project: Path, path: str):
    return json.loads((project / path).read_text())


def rows_by_origin(path: Path, split: str | None = None) -> dict[tuple[str, str], int]:
    """(direction, origin kind: teacher | reference) -> rows, of a pair file (of one split of a rejected file)."""
    table = pq.read_table(path)
    counts: dict[tuple[str, str], int] = {}
    splits = table.column("split").to_pylist() if split else [None] * len(table)
    for src, tgt, origin, row_split in zip(table.column("src_lang").to_pylist(), table.column("tgt_lang").to_pylist(),
                                           table.column("origin").to_pylist(), splits, strict=True):
        if split and row_split != split:
            continue
        key = (f"{src}-{tgt}", origin.split(" ", 1)[0].rstrip(":"))
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_every_training_source_is_translated_once_and_every_translation_is_kept_or_rejected(project):
    teacher_clean = read(project, "metrics/clean.json")["directions"]
    distill = read(project, "metrics/student/distill.json")
    kept = rows_by_origin(project / "data/student/clean/train.parquet")
    rejected = rows_by_origin(project / "data/student/clean/rejected.parquet", split="train")
    for direction in DIRECTIONS:
        sources = teacher_clean[direction]["train"]["kept"]
        figures = distill["directions"][direction]
        assert figures["sources"] == figures["translated"] == sources
        assert figures["references"] == round(0.2 * sources)
        assert kept.get((direction, "teacher"), 0) + rejected.get((direction, "teacher"), 0) == sources
        assert kept.get((direction, "reference"), 0) + rejected.get((direction, "reference"), 0) == \
            figures["references"]
        assert kept.get((direction, "teacher"), 0) > sources // 2
    reasons = pq.read_table(project / "data/student/clean/rejected.parquet").column("reason").to_pylist()
    assert all(reasons), "every rejected row has its reason"
    origins = pq.read_table(project / "data/student/raw/train.parquet").column("origin").to_pylist()
    digest = distill["teacher"]["digest"]
    assert all(o.startswith((f"teacher {digest}: ", "reference: ")) for o in origins)


def test_the_student_is_scored_on_the_teachers_test_sets_beside_the_teacher(project):
    teacher, student = read(project, "metrics/eval.json"), read(project, "metrics/student/eval.json")
    assert set(student) == set(teacher) == {"test_2016_flickr", "macro"}
    for direction in DIRECTIONS:
        entry = student["test_2016_flickr"][direction]
        assert entry["sentences"] == teacher["test_2016_flickr"][direction]["sentences"] == 100
        assert entry["teacher"]["bleu"] == teacher["test_2016_flickr"][direction]["bleu"]
    assert student["macro"]["teacher"]["bleu"] == teacher["macro"]["bleu"]
    page = (project / "reports/student/eval/index.html").read_text()
    assert "teacher BLEU" in page and "vs teacher" in page


def test_the_student_is_smaller_passes_its_export_gate_and_its_card_names_the_teacher(project):
    student, teacher = read(project, "metrics/student/train.json"), read(project, "metrics/train.json")
    assert student["parameters"] < teacher["parameters"]
    export = read(project, "metrics/student/export.json")
    assert export["identical_share"] >= 0.99 and (project / "models/student/export/decoder.int8.onnx").is_file()
    # The student decodes with its own export block's shortlist; the teacher's export keeps the whole vocabulary.
    assert "shortlist" in export and (project / "models/student/export/decoder.shortlist.int8.onnx").is_file()
    assert not (project / "models/export/shortlist.npz").is_file()
    card = (project / "models/student/release/README.md").read_text()
    digest = read(project, "metrics/student/distill.json")["teacher"]["digest"]
    assert "## Distillation" in card and digest in card and "knowledge-distillation" in card
    assert "mtpipe-en-de-fr-student" in card


def test_the_student_export_translates_with_mtpipe_translate(project):
    out = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "translate", "--model",
                          str(project / "models/student/export"), "--tgt", "fr"],
                         input="A dog runs.\n", capture_output=True, text=True, cwd=project, check=True)
    assert len(out.stdout.splitlines()) == 1


def test_the_summary_shows_the_student_beside_its_teacher(project):
    out = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "summary"], capture_output=True, text=True,
                         cwd=project, check=True).stdout
    assert "Student distilled from models/export" in out and "teacher BLEU" in out


def test_a_student_change_reruns_only_the_student_and_a_teacher_change_reruns_the_distillation(project):
    set_distill(project, {}, train={"max_steps": 110})
    ran = stages_run(dvc(project, "repro"))
    # check_params reruns on any change to params.yaml; its output does not change, so nothing reruns for it.
    assert sorted(ran) == sorted(["check_params", "student_train", "student_evaluate", "student_export",
                                  "student_card"])
    # A new export of the same teacher weights (here: a parity check on fewer sentences) is a new models/export:
    # the distillation reruns; its translations are the same, so the student's corpus, vocabulary and weights stay.
    set_params(project, {"export": {"parity_sentences": 12}})
    ran = stages_run(dvc(project, "repro"))
    assert sorted(ran) == ["card", "check_params", "distill", "export"]
    # The student's export block is its own: a change there reruns the student's export and card only.
    set_distill(project, {}, export={"parity_sentences": 12})
    ran = stages_run(dvc(project, "repro"))
    assert sorted(ran) == ["check_params", "student_card", "student_export"]


def read_params(project: Path) -> dict:
    return yaml.safe_load((project / "params.yaml").read_text())
