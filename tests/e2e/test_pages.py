"""Each page a person opens, checked as they would see it: built by the real code on tiny inputs, opened in
headless Chromium with every request to another host blocked, and required to load fully, with no failed request
and no console error. Screenshots land in the test's temporary directory (docs/img holds the README's).

Skipped where no Chromium is installed (Debian: `apt-get install chromium`); CI installs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.tools.cli import main
from pipeline.tools.plots_page import PLOTS_DIR
from tests.page_check import check_page, find_chromium

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(find_chromium() is None, reason="no Chromium (apt-get install chromium)")]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Every Data Docs page: Bootstrap styled the navigation bar, and jQuery, bootstrap-table and vega-embed run.
DATA_DOCS_LOADED = ("getComputedStyle(document.querySelector('.navbar')).display === 'flex'"
                    " && typeof jQuery === 'function' && typeof jQuery.fn.bootstrapTable === 'function'"
                    " && typeof vegaEmbed === 'function'")
# A validation result page besides: bootstrap-table built its tables, and Font Awesome's font loaded for the icons.
VALIDATION_DRAWN = (DATA_DOCS_LOADED + " && document.querySelectorAll('.bootstrap-table').length > 0"
                    " && [...document.fonts].some(f => f.family.includes('Font Awesome') && f.status === 'loaded')")
PLOTS_DRAWN = ("document.querySelectorAll('.vega-embed').length === 2"
               " && [...document.querySelectorAll('.vega-embed')].every(e => e.querySelector('canvas, svg'))")


def assert_reads_offline(page: Path, shot: Path, ready: str | None = None) -> None:
    result = check_page(page, shot, ready_expression=ready, timeout_s=60)
    assert result.problems == [], "\n".join(result.problems)
    assert shot.read_bytes().startswith(PNG_MAGIC)


@pytest.fixture(scope="module")
def data_docs(tmp_path_factory) -> Path:
    from stages import validate
    from tests.support.validate_corpus import GOOD_TRAIN, corpus

    paths = corpus(tmp_path_factory.mktemp("validate"), GOOD_TRAIN)
    validate.run(parse({"validate": {"min_rows": 1}}), paths)  # five pairs pass: the suite's pages show successes
    return paths.validation_report


@pytest.mark.parametrize("which", ["index.html", "validations", "expectations"])
def test_data_docs_pages_render_fully_offline(data_docs, which, tmp_path):
    page = data_docs / which if which.endswith(".html") else sorted((data_docs / which).rglob("*train-en-de.html"))[0]
    assert_reads_offline(page, tmp_path / "data-docs.png",
                         VALIDATION_DRAWN if which == "validations" else DATA_DOCS_LOADED)


def test_the_training_curves_page_draws_its_plots_offline(tmp_path, monkeypatch):
    from tests.support.run_files import dvclive_project

    monkeypatch.chdir(dvclive_project(tmp_path))
    assert main(["plots"]) == 0
    assert_reads_offline(tmp_path / PLOTS_DIR / "index.html", tmp_path / "plots.png", PLOTS_DRAWN)


def test_the_evaluation_report_renders_offline(tiny_model_dir, tmp_path):
    from stages import evaluate
    from tests.support.export_helpers import one_torch_thread

    paths = Paths(tmp_path)
    shutil.copytree(tiny_model_dir, paths.final_model)
    paths.clean.mkdir(parents=True)
    shutil.copy2(tiny_model_dir.parent.parent / "data" / "clean" / "test.parquet", paths.clean)
    with one_torch_thread():
        evaluate.run(parse({"evaluate": {"beam": 1, "max_len_b": 4}}), paths)
    assert_reads_offline(paths.eval_dir / "index.html", tmp_path / "eval.png",
                         "document.querySelectorAll('svg.length-plot circle.dot').length === 50")
