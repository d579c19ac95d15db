"""The student's stages are the teacher's modules run with --student: the distill blocks as params, the paths one
folder down, and with distillation off a note in every output instead of work."""

from __future__ import annotations

import json

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.stage import DISABLED_NOTE, run_stage

SMALL_STUDENT = {"preset": "tiny", "d_model": 32, "ffn_dim": 64, "decoder_layers": 1}


def test_the_student_paths_mirror_the_teachers_one_folder_down(tmp_path):
    teacher, student = Paths(tmp_path), Paths(tmp_path).student()
    assert student.clean == tmp_path / "data/student/clean"
    assert student.final_model == tmp_path / "models/student/final"
    assert student.metrics("eval") == tmp_path / "metrics/student/eval.json"
    assert student.dvclive == tmp_path / "dvclive/student"
    assert student.params_checked == teacher.params_checked  # one check of params.yaml serves both
    assert student.teacher() == teacher and teacher.student() == student


@pytest.mark.parametrize("stage", ["distill", "clean", "validate", "tokenize", "train", "evaluate", "export", "card"])
def test_with_distillation_off_a_student_stage_writes_a_note_into_each_output_and_runs_nothing(tmp_path, stage):
    def must_not_run(params, paths):
        raise AssertionError("the stage ran")

    assert run_stage(must_not_run, stage, parse({}), student=True, root=tmp_path) == {"distill": "disabled"}
    outputs = Paths(tmp_path).student().outputs(stage)
    for path in outputs:
        if path.suffix == ".json":
            assert json.loads(path.read_text()) == {"distill": "disabled"}
        else:
            assert (path / "DISABLED").read_text().strip() == DISABLED_NOTE
    assert not (tmp_path / "models" / "final").exists()  # nothing of the teacher's is touched


def test_with_distillation_on_a_student_stage_runs_with_the_student_params_on_the_student_paths(tmp_path):
    params = parse({"distill": {"enabled": True, "model": SMALL_STUDENT, "train": {"max_steps": 9}}})
    seen = {}

    def stage(p, paths):
        seen.update(steps=p.train.max_steps, d_model=p.model.architecture()["d_model"], root=paths.final_model)
        return {}

    run_stage(stage, "train", params, student=True, root=tmp_path)
    assert seen == {"steps": 9, "d_model": 32, "root": tmp_path / "models/student/final"}
    run_stage(stage, "train", params, student=False, root=tmp_path)
    assert seen == {"steps": 2400, "d_model": 64, "root": tmp_path / "models/final"}


def test_a_students_evaluation_page_shows_the_teachers_bleu_beside_its_own():
    from pipeline.params import EvaluateParams
    from stages.evaluate.report_html import html_report
    from stages.evaluate.results import DirectionResult, eval_json

    scores = {"bleu": 30.0, "chrf": 55.0, "ter": 50.0, "sentences": 3, "signature": {},
              "teacher": {"bleu": 31.5, "chrf": 56.0, "ter": 49.0}}
    result = DirectionResult("test", "en-de", scores, [])
    page = html_report([result], EvaluateParams())
    assert "teacher BLEU" in page and "31.50" in page and "-1.50" in page
    assert eval_json([result])["macro"]["teacher"] == {"bleu": 31.5, "chrf": 56.0, "ter": 49.0}
    plain = DirectionResult("test", "en-de", {k: v for k, v in scores.items() if k != "teacher"}, [])
    assert "teacher BLEU" not in html_report([plain], EvaluateParams())
