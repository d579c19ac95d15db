"""`mtpipe`: fast to start, clear about bad params, honest about what exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.artifacts import Paths
from pipeline.tools.cli import main, summary

REPO = Path(__file__).resolve().parents[2]


def test_params_prints_effective_settings_with_the_resolved_preset(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["params"]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert effective["model"]["architecture"]["d_model"] == 64  # tiny preset
    assert effective["validate"]["min_rows"] >= 1  # the section keeps its params.yaml name


def test_params_on_a_bad_file_exits_2_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "params.yaml"
    bad.write_text("train:\n  lr: fast\n")
    assert main(["params", str(bad)]) == 2
    assert "train.lr = 'fast'" in capsys.readouterr().err


def test_run_refuses_bad_params_before_dvc_starts(tmp_path, capsys, monkeypatch):
    (tmp_path / "params.yaml").write_text("trian: {}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 2
    assert "trian: unknown key" in capsys.readouterr().err
    assert not (tmp_path / ".dvc").exists()


def test_summary_lists_scores_and_marks_missing_artifacts(tmp_path):
    paths = Paths(tmp_path)
    assert "No evaluation yet" in summary(paths)
    paths.metrics("eval").parent.mkdir(parents=True)
    paths.metrics("eval").write_text(
        json.dumps(
            {
                "newstest2014": {
                    "bleu": 27.31,
                    "chrf": 56.2,
                    "sentences": 3003,
                    "signature": {"bleu": "nrefs:1|tok:13a", "chrf": "x"},
                }
            }
        )
    )
    text = summary(paths)
    assert "newstest2014" in text and "27.31" in text and "3003 sentences" in text
    assert f"{paths.final_model}  (missing)" in text


def test_console_script_starts_without_heavy_imports():
    heavy = "('torch', 'transformers', 'dvc', 'prefect')"
    code = f"import sys, pipeline.tools.cli; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
