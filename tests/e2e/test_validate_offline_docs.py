"""The Data Docs the validate stage writes load nothing from another host: the web assets sit beside the pages,
GX's logo is the site's own copy, and every page's favicon link names the site's favicon."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.offline_pages import page_references
from pipeline.params import parse
from pipeline.runtime.web_assets import SITE_ASSETS
from stages import validate
from stages.validate.offline_docs import SITE_FAVICON, SITE_LOGO, fix_favicon_links
from tests.support.validate_corpus import GOOD_TRAIN, corpus

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    paths = corpus(tmp_path_factory.mktemp("docs"), GOOD_TRAIN)
    validate.run(parse({"validate": {"min_rows": 1}}), paths)
    return paths.validation_report


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if not p.is_relative_to(site / SITE_ASSETS))


def test_no_page_loads_from_another_host_and_every_reference_names_a_file(site):
    assert len(pages(site)) == 7  # the index, three suites, three validation results
    for page in pages(site):
        for ref in page_references(page):
            assert not ref.is_external, ref
            assert (page.parent / ref.url.split("?")[0]).is_file(), ref


def test_the_logo_and_the_favicon_are_the_sites_own_files(site):
    for page in pages(site):
        refs = {ref.url.rsplit("/", 2)[-1]: (page.parent / ref.url).resolve() for ref in page_references(page)}
        assert refs["logo-long.png"] == (site / SITE_LOGO).resolve(), page
        assert refs["favicon.ico"] == (site / SITE_FAVICON).resolve(), page


def test_the_web_assets_are_copied_once_into_the_sites_static_directory(site):
    copied = sorted(p.name for p in (site / SITE_ASSETS).iterdir())
    assert "jquery@3.7.1" in copied and "vega@5.20.2" in copied and "bootstrap@4.3.1" in copied
    assert sorted(p.name for p in site.iterdir()) == ["expectations", "index.html", "static", "validations"]


def test_favicon_links_are_pointed_at_the_site_root_from_any_depth(tmp_path):
    deep = tmp_path / "validations" / "a" / "b" / "c" / "page.html"
    deep.parent.mkdir(parents=True)
    deep.write_text('<link rel="shortcut icon" href="../../../static/images/favicon.ico" type="image/x-icon"/>')
    fix_favicon_links(tmp_path)
    assert 'href="../../../../static/images/favicon.ico"' in deep.read_text()
