"""The whole DAG on the embedded sample, in a temporary git + DVC copy: real stages, real caching."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import (
    STUDENT_STAGES,
    TEACHER_STAGES,
    dvc,
    git,
    project_copy,
    set_params,
    stages_run,
    teacher_and_student_stages,
)

pytestmark = pytest.mark.e2e
FAST = {
    "model": {"preset": "tiny"},
    "train": {"max_steps": 40, "valid_every": 20, "log_every": 10, "max_minutes": 5},
    "export": {"parity_sentences": 16},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = project_copy(tmp_path_factory.mktemp("project"))
    set_params(root, FAST)
    git(root, "commit", "-qam", "fast params")
    first = dvc(root, "repro")
    # Distillation is off: its stages ran too, each writing a note into its outputs.
    assert teacher_and_student_stages(first) == (TEACHER_STAGES, STUDENT_STAGES)
    return root


def test_first_repro_produces_every_artifact(project):
    for path in ("data/raw/train.parquet", "data/clean/rejected.parquet", "reports/validation/index.html",
                 "data/tokenized/spm.model", "models/final/config.json", "reports/eval/test.en-de.hyp.txt",
                 "models/export/encoder.onnx", "models/export/decoder.onnx", "dvc.lock"):
        assert (project / path).exists(), path
    scores = json.loads((project / "metrics/eval.json").read_text())
    assert set(scores) == {"test", "macro"}  # one direction: macro is its scores
    assert set(scores["test"]["en-de"]) >= {"bleu", "chrf", "signature"}
    assert "tok:13a" in scores["test"]["en-de"]["signature"]["bleu"]
    hypotheses = (project / "reports/eval/test.en-de.hyp.txt").read_text().splitlines()
    assert len(hypotheses) == scores["test"]["en-de"]["sentences"] == 268


def test_the_release_and_models_final_are_one_copy_on_disk_after_repro_and_after_checkout(project):
    def release_files_linked() -> list[bool]:
        final = sorted((project / "models/final").iterdir())
        return [(project / "models/release" / f.name).samefile(f) for f in final]

    assert release_files_linked() and all(release_files_linked())
    shutil.rmtree(project / "models/release")
    shutil.rmtree(project / "models/final")
    dvc(project, "checkout")
    assert all(release_files_linked())
    assert (project / "models/release/README.md").is_file()


def test_final_model_loads_with_the_auto_classes(project):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(project / "models/final")
    tokenizer = AutoTokenizer.from_pretrained(project / "models/final")
    out = model.generate(**tokenizer(["The weather is nice today."], return_tensors="pt"), max_new_tokens=8)
    assert isinstance(tokenizer.decode(out[0], skip_special_tokens=True), str)


def test_dvc_shows_the_training_curves_and_the_scores(project):
    plots = json.loads(dvc(project, "plots", "show", "--json").stdout)
    assert not plots.get("errors"), plots["errors"]
    shown = json.dumps(plots)
    for curve in ("train/loss.tsv", "train/lr.tsv", "train/tgt_tokens_per_s.tsv", "valid/loss.tsv"):
        assert curve in shown, curve
    metrics = json.loads(dvc(project, "metrics", "show", "--json").stdout)
    assert "metrics/eval.json" in json.dumps(metrics) and '"bleu"' in json.dumps(metrics)


def test_second_repro_reruns_nothing(project):
    result = dvc(project, "repro")
    assert stages_run(result) == []
    assert dvc(project, "status").stdout.strip().startswith("Data and pipelines are up to date")


@pytest.mark.parametrize(
    ("edit", "dotted_key"),
    [
        (lambda params: params.update(trian=params["train"]), "trian"),  # a misspelt section DVC alone never reads
        (lambda params: params["train"].update(lrr=0.01), "train.lrr"),  # a misspelt key of a section train reads
    ],
)
def test_a_misspelt_param_stops_repro_before_any_stage_works_and_keeps_the_outputs(project, edit, dotted_key):
    params_file = project / "params.yaml"
    good = params_file.read_text()
    params = yaml.safe_load(good)
    edit(params)
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        result = dvc(project, "repro", check=False)
        assert result.returncode != 0
        assert stages_run(result) == ["check_params"]
        assert f"{dotted_key}: unknown key" in result.stdout + result.stderr
        # DVC removes a stage's outputs before running it: no stage past the check ran, so the model is still here.
        assert (project / "models/final/config.json").is_file()
    finally:
        params_file.write_text(good)
    # Valid again: at most the check itself reruns (DVC removed its output before the failed run).
    assert set(stages_run(dvc(project, "repro"))) <= {"check_params"}


def test_editing_a_module_evaluate_imports_marks_evaluate_changed(project):
    # pipeline/runtime/decoding.py is not evaluate's own module: only its deps say that evaluate runs it.
    helper = project / "pipeline" / "runtime" / "decoding.py"
    original = helper.read_text()
    helper.write_text(original + "# an edit\n")
    try:
        status = dvc(project, "status", "--json").stdout
        changed = json.loads(status)
        assert "evaluate" in changed, status
        assert "download" not in changed and "clean" not in changed
    finally:
        helper.write_text(original)
    assert dvc(project, "status").stdout.strip().startswith("Data and pipelines are up to date")


def test_changing_max_steps_reruns_only_train_evaluate_and_export(project):
    set_params(project, {"train": {"max_steps": 30}})
    result = dvc(project, "repro")
    # check_params reruns on any change to params.yaml; its output does not change, so nothing reruns for it. A new
    # teacher (its export, its scores) reruns distill and student_evaluate, which with distillation off rewrite their
    # notes; the notes unchanged, nothing after them reruns.
    assert teacher_and_student_stages(result) == (["check_params", "train", "evaluate", "export", "card"],
                                                  ["distill", "student_evaluate"])
    assert json.loads((project / "metrics/train.json").read_text())["steps"] == 30


def test_exp_run_with_a_param_override_records_bleu(project):
    git(project, "add", "-A")
    git(project, "commit", "-qm", "baseline")
    result = dvc(project, "exp", "run", "-S", "train.lr=0.001", "-n", "lower-lr")
    assert teacher_and_student_stages(result) == (["check_params", "train", "evaluate", "export", "card"],
                                                  ["distill", "student_evaluate"])
    shown = json.loads(dvc(project, "exp", "show", "--json").stdout)
    experiments = [e for rev in shown for e in (rev.get("experiments") or [])]
    runs = [r for e in experiments for r in e.get("revs", [])]
    named = [r for r in runs if r.get("name") == "lower-lr"]
    assert named, shown
    data = named[0]["data"]
    assert data["params"]["params.yaml"]["data"]["train"]["lr"] == 0.001
    bleu = data["metrics"]["metrics/eval.json"]["data"]["test"]["en-de"]["bleu"]
    assert isinstance(bleu, float)
    # The experiment's results are in the workspace: `dvc metrics diff` shows the BLEU change against the baseline.
    diff = json.loads(dvc(project, "metrics", "diff", "--all", "--json").stdout)
    change = diff["metrics/eval.json"]["test.en-de.bleu"]
    assert change["new"] == bleu
    assert change["diff"] == pytest.approx(change["new"] - change["old"])


def test_another_runs_export_as_teacher_is_a_dependency_of_the_distillation(project, tmp_path):
    # distill.teacher names the export directory; dvc.yaml makes it distill's dependency (`${distill.teacher}`),
    # so replacing or retraining a teacher outside this project reruns the distillation, as this run's export does.
    teacher = tmp_path / "teacher-export"
    shutil.copytree(project / "models/export", teacher)
    set_params(project, {"distill": {"teacher": str(teacher)}})
    dvc(project, "repro")
    assert dvc(project, "status").stdout.strip().startswith("Data and pipelines are up to date")
    (teacher / "export.json").write_text((teacher / "export.json").read_text() + "\n")
    changed = json.loads(dvc(project, "status", "--json").stdout)
    assert list(changed) == ["distill"], changed
    assert {"changed deps": {str(teacher): "modified"}} in changed["distill"], changed
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["distill"]
    assert str(teacher) in [d["path"] for d in lock["deps"]]
