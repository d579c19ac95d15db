"""Fixtures of the export, translate and service tests: a sharpened copy of the tiny model (outputs garbage, but
decisive: see tests/support/export_helpers.py), one fp32 export of it that the services and the n-best tests only
read, and one export with every format that the export and translate tests only read.

Exporting two ONNX graphs takes tens of seconds on two cores, so each export is built once per test process
(session scope); tests that need the stage to fail or to skip formats run it again on a fresh root.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.artifacts import Paths
from tests.support.export_helpers import FULL_EXPORT, export_params, one_torch_thread, sharpened_root


@pytest.fixture(scope="session")
def make_sharpened_root(tiny_model_dir, tmp_path_factory) -> Callable[[], Paths]:
    """A factory of fresh project roots with the sharpened model (for tests that run the stage themselves)."""
    return lambda: sharpened_root(tiny_model_dir, tmp_path_factory.mktemp("root"))


@pytest.fixture(scope="session")
def fp32_exported(make_sharpened_root) -> Paths:
    """The paths of one export stage run with the fp32 ONNX graphs alone (no int8, TorchScript or CTranslate2)."""
    from stages import export

    paths = make_sharpened_root()
    with one_torch_thread():
        export.run(export_params(int8=False, torchscript=False, ctranslate2=False), paths)
    return paths


@pytest.fixture(scope="session")
def export_dir(fp32_exported) -> Path:
    return fp32_exported.export


@pytest.fixture(scope="session")
def translator(export_dir):
    from pipeline.runtime.translate import Translator

    return Translator(export_dir, threads=1)


@pytest.fixture(scope="session")
def exported(make_sharpened_root) -> tuple[Paths, dict]:
    """(paths, summary) of one export stage run with every format."""
    from stages import export

    paths = make_sharpened_root()
    with one_torch_thread():
        summary = export.run(export_params(**FULL_EXPORT), paths)
    return paths, summary


@pytest.fixture(scope="module")
def torch_on_one_thread():
    """For a whole test module (see export_helpers.one_torch_thread)."""
    with one_torch_thread():
        yield
