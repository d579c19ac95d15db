"""The whole DAG on the embedded sample, in a temporary git + DVC copy: real stages, real caching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import dvc, git, project_copy, set_params, stages_run

pytestmark = pytest.mark.e2e
ALL = ["download", "clean", "validate", "tokenize", "train", "evaluate", "export"]
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
    assert stages_run(first) == ALL
    return root


def test_first_repro_produces_every_artifact(project):
    for path in ("data/raw/train.parquet", "data/clean/rejected.parquet", "reports/validation/index.html",
                 "data/tokenized/spm.model", "models/final/config.json", "reports/eval/test.hyp.txt",
                 "models/export/encoder.onnx", "models/export/decoder.onnx", "dvc.lock"):
        assert (project / path).exists(), path
    scores = json.loads((project / "metrics/eval.json").read_text())
    assert set(scores) == {"test"}
    assert set(scores["test"]) >= {"bleu", "chrf", "signature"}
    assert "tok:13a" in scores["test"]["signature"]["bleu"]
    assert len((project / "reports/eval/test.hyp.txt").read_text().splitlines()) == scores["test"]["sentences"] == 268


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


def test_changing_max_steps_reruns_only_train_evaluate_and_export(project):
    set_params(project, {"train": {"max_steps": 30}})
    result = dvc(project, "repro")
    assert stages_run(result) == ["train", "evaluate", "export"]
    assert json.loads((project / "metrics/train.json").read_text())["steps"] == 30


def test_exp_run_with_a_param_override_records_bleu(project):
    git(project, "add", "-A")
    git(project, "commit", "-qm", "baseline")
    result = dvc(project, "exp", "run", "-S", "train.lr=0.001", "-n", "lower-lr")
    assert stages_run(result) == ["train", "evaluate", "export"]
    shown = json.loads(dvc(project, "exp", "show", "--json").stdout)
    experiments = [e for rev in shown for e in (rev.get("experiments") or [])]
    runs = [r for e in experiments for r in e.get("revs", [])]
    named = [r for r in runs if r.get("name") == "lower-lr"]
    assert named, shown
    data = named[0]["data"]
    assert data["params"]["params.yaml"]["data"]["train"]["lr"] == 0.001
    bleu = data["metrics"]["metrics/eval.json"]["data"]["test"]["bleu"]
    assert isinstance(bleu, float)
    # The experiment's results are in the workspace: `dvc metrics diff` shows the BLEU change against the baseline.
    change = json.loads(dvc(project, "metrics", "diff", "--all", "--json").stdout)["metrics/eval.json"]["test.bleu"]
    assert change["new"] == bleu
    assert change["diff"] == pytest.approx(change["new"] - change["old"])
