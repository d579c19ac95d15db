"""Helpers of the export and translate tests (their shared fixtures are in tests/unit/conftest.py).

The tiny model is untrained, so its logits are nearly flat and argmaxes can be decided by 1e-5; the copy used here
has its (tied) embeddings scaled up so every argmax is decisive and the comparisons test the runtimes, not float
noise. The <pad> row stays zero (scaling keeps it so), as training keeps it.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.artifacts import Paths
from pipeline.params import Params, parse

# Scales the untrained model's logits from std ~0.16 to ~1.6: top-2 margins go from ~1e-5 to ~0.5.
EMBEDDING_SCALE = 10.0
PARITY_SENTENCES = 32
CTRANSLATE2_INSTALLED = importlib.util.find_spec("ctranslate2") is not None
# Every format the stage has, CTranslate2 where it is installed; thresholds are the defaults.
FULL_EXPORT = {"int8": True, "torchscript": True, "ctranslate2": CTRANSLATE2_INSTALLED}


def sharpened_root(tiny_model_dir: Path, root: Path) -> Paths:
    """A project root with the fixture's cleaned splits and a sharpened copy of its model as models/final."""
    import torch
    from transformers import MarianMTModel

    paths = Paths(root)
    shutil.copytree(tiny_model_dir.parent.parent / "data" / "clean", paths.clean)
    shutil.copytree(tiny_model_dir, paths.final_model)
    model = MarianMTModel.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    model.save_pretrained(paths.final_model)
    return paths


def export_params(**export_overrides) -> Params:
    return parse({"export": {"parity_sentences": PARITY_SENTENCES, **export_overrides}})


def load_model(model_dir: Path):
    from transformers import AutoTokenizer, MarianMTModel

    return MarianMTModel.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """PyTorch on one thread, restored afterwards.

    When other processes keep the cores busy, torch's OpenMP threads spin against them and a tiny model's
    `generate` can take tens of times longer with two threads than with one. These tests check results, which do not
    depend on the thread count.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
