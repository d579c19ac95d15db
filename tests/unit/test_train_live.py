"""The training curves in a project whose Git repository has no commit yet (`git init`, `dvc init`, `dvc repro`):
DVC runs there, and so must the train stage's DVCLive logger."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from stages.train.live import Logger


def _project(root, commit: bool) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    from dvc.repo import Repo

    Repo.init(str(root)).close()
    if commit:
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                        "commit", "-qm", "init"], check=True)


@pytest.mark.parametrize("commit", [False, True], ids=["no-commit", "committed"])
def test_curves_are_written_with_or_without_a_commit(tmp_path, monkeypatch, caplog, commit):
    _project(tmp_path, commit)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mtpipe.train"):
        logger = Logger(tmp_path / "dvclive", enabled=True)
        logger.log({"step": 10, "train/loss": 3.5})
    summary = json.loads((tmp_path / "dvclive" / "metrics.json").read_text())
    assert summary["step"] == 10 and summary["train"]["loss"] == 3.5
    assert (tmp_path / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv").is_file()
    warned = [r.getMessage() for r in caplog.records if "DVCLive" in r.getMessage()]
    assert bool(warned) == (not commit)
    if warned:
        assert "no commit yet" in warned[0]
