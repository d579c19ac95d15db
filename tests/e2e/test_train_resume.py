"""Exact resume through DVC: `dvc repro` killed with SIGKILL mid-training, then `dvc repro` again, ends where an
uninterrupted run ends, with the same loss curve after the resume point."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import BIN, dvc, git, project_copy, set_params, stages_run

pytestmark = pytest.mark.e2e
SETTINGS = {
    "model": {"preset": "tiny"},
    "train": {"max_steps": 100, "save_every": 10, "log_every": 5, "valid_every": 25, "valid_bleu_sentences": 16,
              "max_tokens": 1024, "max_minutes": 10, "threads": 1},
}
KILL_AFTER_STEP = 35  # the checkpoint on disk is then at update 30 or later


def curve(root: Path, name: str) -> dict[int, float]:
    path = root / "dvclive" / "plots" / "metrics" / f"{name}.tsv"
    if not path.exists():
        return {}
    column = name.split("/")[-1]
    with open(path, encoding="utf-8") as f:  # may be mid-write while training runs: skip an incomplete last row
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r.get("step") and r.get(column)]
    return {int(r["step"]): float(r[column]) for r in rows}


def final_weights(root: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(root / "models" / "final" / "model.safetensors")


def checkpoint_step(root: Path) -> int:
    import torch

    return torch.load(root / "models" / "checkpoints" / "last.pt", weights_only=False)["progress"]["step"]


def repro_killed_mid_training(root: Path) -> int:
    """Run `dvc repro -f -s train`, SIGKILL dvc and the stage once training is past KILL_AFTER_STEP."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "HF_HUB_OFFLINE": "1"}
    # A session of its own: killpg reaches dvc and the python stage it started, as a crash of the machine would.
    proc = subprocess.Popen([str(BIN / "dvc"), "repro", "-f", "-s", "train"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    last_pt = root / "models" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if last_pt.exists() and max(curve(root, "train/loss"), default=0) >= KILL_AFTER_STEP:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        else:
            pytest.fail("training finished (or stalled) before it could be killed mid-run")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return checkpoint_step(root)


def test_a_sigkilled_repro_resumes_to_the_same_curve_and_step_count(tmp_path):
    root = project_copy(tmp_path / "project")
    set_params(root, SETTINGS)
    git(root, "commit", "-qam", "resume test params")

    uninterrupted = dvc(root, "repro", "train")
    assert "train" in stages_run(uninterrupted)
    expected = json.loads((root / "metrics" / "train.json").read_text())
    expected_loss, expected_valid = curve(root, "train/loss"), curve(root, "valid/loss")
    expected_weights = final_weights(root)
    assert expected["steps"] == 100 and expected["resumed_from_step"] is None

    # The same run again from scratch, killed mid-training...
    for f in (root / "models" / "checkpoints").iterdir():
        if f.is_file():
            f.unlink()
    resume_step = repro_killed_mid_training(root)
    assert 30 <= resume_step < 100
    assert not (root / "models" / "final").exists()  # it never got to write its model

    # ... and `dvc repro` again: DVC kept models/checkpoints (persist: true), training continues from it.
    resumed = dvc(root, "repro", "train")
    assert stages_run(resumed) == ["train"]
    assert f"at update {resume_step} " in resumed.stdout + resumed.stderr
    metrics = json.loads((root / "metrics" / "train.json").read_text())
    assert metrics["resumed_from_step"] == resume_step
    assert metrics["steps"] == expected["steps"] and metrics["stop_reason"] == expected["stop_reason"]

    loss, valid = curve(root, "train/loss"), curve(root, "valid/loss")
    assert sorted(loss) == sorted(expected_loss) == list(range(5, 101, 5))  # complete, no step twice
    assert [s for s in loss if s > resume_step], "nothing was trained after the resume point"
    for step in loss:
        assert loss[step] == pytest.approx(expected_loss[step], rel=1e-6, abs=1e-9), step
    assert valid == pytest.approx(expected_valid, rel=1e-6)
    got = final_weights(root)
    assert all(got[k].allclose(expected_weights[k], atol=1e-6) for k in expected_weights)

    # The curves `dvc plots show` draws, the resumed run's BLEU among them.
    plots = json.dumps(json.loads(dvc(root, "plots", "show", "--json").stdout))
    for name in ("train/loss.tsv", "train/lr.tsv", "train/tgt_tokens_per_s.tsv", "train/padding_efficiency.tsv",
                 "valid/loss.tsv", "valid/bleu.tsv", "system/cpu_percent.tsv"):
        assert name in plots, name
