"""Write the final model as a standard `save_pretrained` directory with its tokenizer beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.artifacts import atomic_path, link_or_copy


def save_final(model: Any, tokenizer_dir: Path, out_dir: Path) -> None:
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        for f in tokenizer_dir.iterdir():
            link_or_copy(f, tmp / f.name)  # the tokenize stage's files, unchanged: one copy on disk
