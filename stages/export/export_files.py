"""The export directory's files besides the graphs: the model's tokenizer and configs, and the sizes reported."""

from __future__ import annotations

import shutil
from pathlib import Path

# Files of models/final that are the PyTorch weights; everything else (tokenizer, configs) is copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")


def copy_model_files(final_model: Path, out: Path) -> list[str]:
    """Copy the tokenizer files, config.json and generation_config.json (everything but the weights), so the export
    directory is self-contained; returns their names."""
    copied = []
    for f in sorted(final_model.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, out / f.name)
            copied.append(f.name)
    return copied


def size_mb(path: Path) -> float:
    """The size of a file, or of every file under a directory, in MB."""
    if path.is_dir():
        return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 3)
    return round(path.stat().st_size / 1e6, 3)
