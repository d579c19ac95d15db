"""Where each artifact lives. dvc.yaml names the same paths; tests/unit/test_dag.py keeps the two in sync.

Every stage gets a `Paths` rooted at the project directory (the working directory under `dvc repro`), so tests
can run a stage against a temporary root. A distilled student (stages/distill) runs the same stages on paths one
level down, `Paths(root, role="student")`: data/student/clean, models/student/final, metrics/student/train.json.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "assets" / "sample"


# The tokenize stage's transformers tokenizer directory, inside data/tokenized.
TOKENIZER_DIR = "hf_tokenizer"


STUDENT = "student"


@dataclass(frozen=True)
class Paths:
    root: Path = Path(".")
    # "" for the model the run trains; "student" for the student distilled from it, whose artifacts mirror the
    # teacher's one folder down, so every stage reads and writes its own the same way.
    role: str = ""

    def student(self) -> Paths:
        return Paths(self.root, STUDENT)

    def teacher(self) -> Paths:
        return Paths(self.root)

    def section(self, name: str) -> str:
        """The params.yaml block this role's stages read for `name`: the student's tokenize, model, train and export
        blocks are distill's (Params.student), so its messages name distill.export, not export."""
        return f"distill.{name}" if self.role else name

    def stage(self, name: str) -> str:
        """This role's dvc.yaml stage called `name` for the teacher: the student's is student_<name>."""
        return f"{self.role}_{name}" if self.role else name

    def _in(self, area: str) -> Path:
        return self.root / area / self.role if self.role else self.root / area

    # check_params: a fixed line, written once params.yaml passed the schema (every stage runs after it)
    @property
    def params_checked(self) -> Path:
        return self.root / "data" / "params_checked"  # one check serves both roles

    # download
    @property
    def raw(self) -> Path:
        return self._in("data") / "raw"

    # clean
    @property
    def clean(self) -> Path:
        return self._in("data") / "clean"

    @property
    def rejected(self) -> Path:
        return self.clean / "rejected.parquet"

    # validate
    @property
    def validation_report(self) -> Path:
        return self._in("reports") / "validation"

    # tokenize
    @property
    def tokenized(self) -> Path:
        return self._in("data") / "tokenized"

    @property
    def spm_model(self) -> Path:
        return self.tokenized / "spm.model"

    @property
    def tokenizer(self) -> Path:
        """The transformers tokenizer every later stage loads, with the model's languages.json beside it."""
        return self.tokenized / TOKENIZER_DIR

    # train
    @property
    def checkpoints(self) -> Path:
        return self._in("models") / "checkpoints"

    @property
    def final_model(self) -> Path:
        return self._in("models") / "final"

    @property
    def dvclive(self) -> Path:
        return self._in("dvclive")

    # evaluate
    @property
    def eval_dir(self) -> Path:
        return self._in("reports") / "eval"

    # export
    @property
    def export(self) -> Path:
        return self._in("models") / "export"

    # card
    @property
    def release(self) -> Path:
        return self._in("models") / "release"

    def metrics(self, stage: str) -> Path:
        return self._in("metrics") / f"{stage}.json"

    def split_file(self, directory: Path, split: str) -> Path:
        return directory / f"{split}.parquet"

    def outputs(self, stage: str) -> tuple[Path, ...]:
        """What a stage writes (its dvc.yaml outs and metrics), from download on; tests/unit/test_dag.py holds
        dvc.yaml to it, and a student stage with distillation off writes a note into each (pipeline/stage.py)."""
        written = {
            "distill": (self.raw, self.metrics("distill")),
            "download": (self.raw,),
            "clean": (self.clean, self.metrics("clean")),
            "validate": (self.validation_report, self.metrics("validation")),
            "tokenize": (self.tokenized, self.metrics("tokenize")),
            "train": (self.final_model, self.checkpoints, self.metrics("train"), self.dvclive / "metrics.json"),
            "evaluate": (self.eval_dir, self.metrics("eval")),
            "export": (self.export, self.metrics("export")),
            "card": (self.release,),
        }
        return written[stage]


def splits_in(directory: Path) -> list[str]:
    """Split names present in a directory of `<split>.parquet` files: train, valid, then test sets sorted."""
    names = {p.stem for p in directory.glob("*.parquet") if p.stem != "rejected"}
    order = [s for s in ("train", "valid") if s in names]
    return order + sorted(names - {"train", "valid"})


def test_splits(directory: Path) -> list[str]:
    return [s for s in splits_in(directory) if s not in ("train", "valid")]


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling path; on success it replaces `final` (file or directory) in one rename."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent)) / final.name
    try:
        yield tmp
        if final.is_dir():
            shutil.rmtree(final)
        elif final.exists():
            final.unlink()
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` where the filesystem allows, else a copy. An artifact that holds another
    stage's file unchanged (the tokenizer in models/final, the model in models/release) then shares its inode, and
    with DVC's hardlink cache (.dvc/config) that of the cache's object too: one copy on disk."""
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, target)
