"""bench/gpu_check.sh --dry-run: the GPU check's own code path on the CPU (CI has no GPU), passing every check that
exists on a CPU, from a corpus it prepares itself, without importing the project's other dependencies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_check_dry_run_passes_on_a_cpu_and_ends_with_one_json_line():
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run([str(REPO / "bench" / "gpu_check.sh"), "--dry-run"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["dry_run"] is True and summary["device"] == "cpu"
    assert summary["passed"] is True and summary["failed"] == []
    checks = summary["checks"]
    assert set(checks) == {"precision_bf16", "precision_fp16", "precision_fp32", "system_figures", "resume_bf16",
                           "nproc", "throughput", "gpu_busy", "bare_python"}
    for precision in ("bf16", "fp16", "fp32"):
        run = checks[f"precision_{precision}"]
        assert run["passed"] and run["last_loss"] < run["first_loss"] and len(run["translations"]) == 2
    resume = checks["resume_bf16"]
    assert resume["kill_exit_code"] == -9 and resume["resumed_from_step"] == resume["checkpoint_step"] > 0
    assert resume["deterministic"] and resume["identical_weights"] and resume["max_rel_loss_diff"] == 0.0
    assert checks["throughput"]["tiny"]["tgt_tokens_per_s"] > 0
    assert checks["bare_python"]["imported_outside_torch_transformers_numpy"] == []


def test_a_prepared_corpus_is_left_out_by_git_wherever_it_lies(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    prepared = tmp_path / "data" / "gpu-check"
    command = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--prepare", str(prepared),
               "--multi30k", str(tmp_path / "absent"), "--pairs", "500", "--vocab-size", "500"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (prepared / "data" / "tokenized" / "spm.model").exists()
    assert json.loads((prepared / "spec_defaults.json").read_text())["prepared_from"] == "assets/sample"
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path,
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""
