"""bench/train_loss.py runs as bench/README.md prints it: the CPU loss and PyTorch's agree on the gradient they time,
an earlier commit's loss is timed beside them, and a commit that is not there is named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench" / "train_loss.py"), "--rows", "400", "--vocab", "997",
                           "--threads", "1", "--repeats", "3", *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO)


def test_the_loss_is_timed_against_pytorch_and_a_commit_and_computes_their_gradient():
    result = bench("--baseline-rev", "HEAD")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["rows"], figures["vocab"], figures["repeats"]) == (400, 997, 3)
    for dtype, step in (("bf16", 2 ** -7), ("fp32", 1e-6)):
        for key in ("ours_ms", "pytorch_ms", "baseline_ms"):
            assert figures[f"{dtype}_{key}"] > 0, (dtype, key)
        ratio = figures[f"{dtype}_pytorch_ms"] / figures[f"{dtype}_ours_ms"]
        assert figures[f"{dtype}_speedup"] == pytest.approx(ratio, rel=0.05)
        # Each gradient is at most 1 / rows: the two lie within one step of its precision (bf16: 2 ** -7).
        assert figures[f"{dtype}_max_grad_difference"] <= step / 400, dtype


def test_a_missing_commit_is_named():
    result = bench("--baseline-rev", "no-such-commit")
    assert result.returncode != 0 and "--baseline-rev no-such-commit" in result.stderr
    assert "Traceback" not in result.stderr
