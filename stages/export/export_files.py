"""The export directory's files besides the graphs: the model's tokenizer and configs, and the sizes reported."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import LANGUAGES_FILE
from pipeline.runtime.text_pieces import TOKENIZER_CONFIG, TOKENIZER_FILES

# Files of models/final that are the PyTorch weights; everything else (tokenizer, configs) is copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")


def required_model_files(family: str) -> tuple[str, ...]:
    """What `mtpipe translate` reads besides the graphs and the manifest: the family's tokenizer files
    (pipeline.runtime.text_pieces), the tokenizer config and languages.json (directions and layouts)."""
    return (*TOKENIZER_FILES[family], TOKENIZER_CONFIG, LANGUAGES_FILE)


def copy_model_files(final_model: Path, out: Path, family: str) -> list[str]:
    """Copy the tokenizer files, config.json, generation_config.json and languages.json (everything but the
    weights), so the export directory is self-contained; returns their names. PipelineError naming the files
    when models/final lacks one a `family` model is translated with."""
    missing = [name for name in required_model_files(family) if not (final_model / name).is_file()]
    if missing:
        raise PipelineError(f"{final_model}: no {', '.join(missing)}, which translating with a {family} export "
                            "needs: train it again (`dvc repro tokenize train`)")
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
