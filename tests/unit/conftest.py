"""Fixtures shared by the export, translate and serve tests: a sharpened copy of the tiny model and one export of
it, and a two-target model (en-de, en-fr: sources tagged >>de<< / >>fr<<) with one export of its own.

Exporting two ONNX graphs takes tens of seconds on two cores, so one export (session-scoped) serves every test
that only reads it; tests that need the stage to fail or to skip formats run it again without re-exporting.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeline.artifacts import Paths
from tests.unit.export_helpers import (
    CTRANSLATE2_INSTALLED,
    FULL_EXPORT,
    export_params,
    one_torch_thread,
    sharpened_root,
    two_target_model_dir,
)


@pytest.fixture(scope="session")
def make_sharpened_root(tiny_model_dir, tmp_path_factory) -> Callable[[], Paths]:
    """A factory of fresh project roots with the sharpened model (for tests that run the stage themselves)."""
    return lambda: sharpened_root(tiny_model_dir, tmp_path_factory.mktemp("root"))


@pytest.fixture(scope="session")
def exported(make_sharpened_root) -> tuple[Paths, dict]:
    """(paths, summary) of one export stage run with every format."""
    from stages import export

    paths = make_sharpened_root()
    with one_torch_thread():
        summary = export.run(export_params(**FULL_EXPORT), paths)
    return paths, summary


@pytest.fixture(scope="session")
def make_two_target_root(tmp_path_factory) -> Callable[[], Paths]:
    """A factory of fresh project roots with the sharpened two-target model and its en-de and en-fr splits."""
    model_dir = two_target_model_dir(tmp_path_factory.mktemp("two_target_model"))
    return lambda: sharpened_root(model_dir, tmp_path_factory.mktemp("two_target_root"))


@pytest.fixture(scope="session")
def two_target_exported(make_two_target_root) -> Paths:
    """The paths of one export of the two-target model: fp32 ONNX, and CTranslate2 (in float32, so its outputs can
    be held to PyTorch's) where it is installed."""
    from stages import export

    paths = make_two_target_root()
    settings = {"int8": False, "torchscript": False, "ctranslate2": CTRANSLATE2_INSTALLED,
                "ctranslate2_quantization": "float32"}
    with one_torch_thread():
        export.run(export_params(**settings), paths)
    return paths


@pytest.fixture(scope="module")
def torch_on_one_thread():
    """For a whole test module (see export_helpers.one_torch_thread)."""
    with one_torch_thread():
        yield
