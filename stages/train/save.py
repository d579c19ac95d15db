"""Write the final model as a standard `save_pretrained` directory with its tokenizer beside it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipeline.artifacts import atomic_path


def save_final(model: Any, tokenizer_dir: Path, out_dir: Path, extra_files: dict[str, str] | None = None) -> None:
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        for f in tokenizer_dir.iterdir():
            shutil.copy2(f, tmp / f.name)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
