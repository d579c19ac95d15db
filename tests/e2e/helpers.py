"""A temporary git + DVC copy of the project, to run the real DAG without touching the working tree, and the
gzipped text files its `data.source: files` reads."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TEACHER_STAGES = ["check_params", "download", "clean", "validate", "tokenize", "train", "evaluate", "export", "card"]
# The distilled student's stages: with distill.enabled false (the default) each writes a note into its outputs.
STUDENT_STAGES = ["distill", "student_clean", "student_validate", "student_tokenize", "student_train",
                  "student_evaluate", "student_export", "student_card"]


def project_copy(dest: Path) -> Path:
    """Copy the files git would commit (tracked and untracked-but-not-ignored) and commit them in a new repo."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not name.startswith(("data/", "models/", "reports/", "metrics/", "dvclive/")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / "dvc.lock").unlink(missing_ok=True)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "project copy")
    return dest


def git(root: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True).stdout


def set_params(root: Path, overrides: dict[str, dict[str, Any]]) -> None:
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for section, values in overrides.items():
        params.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    result = subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"dvc {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def stages_run(result: subprocess.CompletedProcess) -> list[str]:
    """Stages `dvc repro` / `dvc exp run` actually executed, in order."""
    return re.findall(r"Running stage '([\w-]+)'", result.stdout + result.stderr)


def teacher_and_student_stages(result: subprocess.CompletedProcess) -> tuple[list[str], list[str]]:
    """The stages a run executed, split into the teacher's and the student's (each in execution order): DVC may
    interleave the two chains, which share no outputs after the teacher's export."""
    ran = stages_run(result)
    return [s for s in ran if s not in STUDENT_STAGES], [s for s in ran if s in STUDENT_STAGES]


def write_gz(path: Path, lines: list[str]) -> str:
    """`lines` as a gzipped text file, one a line, as `data.files` names them; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def multi30k_per_language(corpus: Path, splits: dict[str, tuple[str, int]], langs: tuple[str, ...]) -> dict:
    """The first n lines of each Multi30k file as `<split>.<lang>.gz` ({split: (Multi30k file, n)}), and the
    `data.files` entries that read them: one pattern per split, `{lang}` in it."""
    from tests.conftest import multi30k_lines

    for split, (name, n) in splits.items():
        for lang in langs:
            write_gz(corpus / f"{split}.{lang}.gz", multi30k_lines(name, lang, n))
    return {split: {"pattern": str(corpus / f"{split}.{{lang}}.gz")} for split in splits}
