"""Fixtures of the service tests: one export of the sharpened tiny model (outputs garbage, but decisive: see
tests/unit/export_helpers.py), built once per test process and only read by the services started on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.export_helpers import export_params, one_torch_thread, sharpened_root


@pytest.fixture(scope="session")
def export_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from stages import export

    paths = sharpened_root(tiny_model_dir, tmp_path_factory.mktemp("serve"))
    with one_torch_thread():
        export.run(export_params(int8=False, torchscript=False, ctranslate2=False), paths)
    return paths.export


@pytest.fixture(scope="session")
def translator(export_dir):
    from pipeline.runtime.translate import Translator

    return Translator(export_dir, threads=1)
