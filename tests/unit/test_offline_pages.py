"""make_offline: CDN URLs become relative paths to copies beside the pages, and anything that would still be
fetched from another host, or names no file, stops it with the file, line and URL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline import offline_pages
from pipeline.offline_pages import OfflinePageError, make_offline, page_references
from pipeline.runtime.web_assets import SITE_ASSETS, package_dir, served_file

BOOTSTRAP_CSS = "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css"
POPPER = "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js"
FONT_AWESOME = "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css"
LOGO = "https://assets.example.org/logo.png"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def page(head: str, body: str = "") -> str:
    return f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>"


@pytest.fixture()
def site(tmp_path) -> Path:
    """A site with a page at the top and one three directories down, both loading from CDNs."""
    site = tmp_path / "site"
    write(site / "images" / "logo.png", "png")
    head = (f'<link rel="stylesheet" href="{BOOTSTRAP_CSS}"/>\n'
            f'<script src="{POPPER}" integrity="sha384-abc" crossorigin="anonymous"></script>\n'
            f'<link rel="stylesheet" href="{FONT_AWESOME}">\n'
            f"<style>.brand {{ background: url('{LOGO}') no-repeat; }}</style>")
    body = f'<img src="{LOGO}?d=20261201T0800Z"><a href="https://example.org/newsletter">subscribe</a>'
    write(site / "index.html", page(head, body))
    write(site / "a" / "b" / "c" / "deep.html", page(head))
    return site


def test_cdn_urls_point_at_copies_beside_the_pages_at_every_depth(site):
    make_offline(site, {LOGO: "images/logo.png"})
    top = (site / "index.html").read_text()
    deep = (site / "a" / "b" / "c" / "deep.html").read_text()
    assert 'href="static/web/bootstrap@4.3.1/dist/css/bootstrap.min.css"' in top
    assert 'src="../../../static/web/popper.js@1.12.9/dist/umd/popper.min.js"' in deep
    # The logo is the site's own file, with and without a query string, in a tag and in a stylesheet.
    assert 'src="images/logo.png"' in top and "url('images/logo.png')" in top
    assert "url('../../../images/logo.png')" in deep
    for name in ("index.html", "a/b/c/deep.html"):
        assert all(not ref.is_external for ref in page_references(site / name)), name


def test_only_the_packages_the_pages_use_are_copied_with_the_files_their_styles_load(site):
    make_offline(site, {LOGO: "images/logo.png"})
    copied = sorted(p.name for p in (site / SITE_ASSETS).iterdir())
    assert copied == ["@fortawesome", "bootstrap@4.3.1", "popper.js@1.12.9"]
    fonts = site / SITE_ASSETS / "@fortawesome" / "fontawesome-free@6.6.0" / "webfonts"
    assert (fonts / "fa-solid-900.woff2").read_bytes() == (
        package_dir(served_file(FONT_AWESOME)[0]) / "webfonts" / "fa-solid-900.woff2").read_bytes()


def test_rewritten_tags_lose_integrity_and_crossorigin_and_links_a_reader_follows_stay(site):
    make_offline(site, {LOGO: "images/logo.png"})
    top = (site / "index.html").read_text()
    assert "integrity" not in top and "crossorigin" not in top
    assert '<a href="https://example.org/newsletter">' in top


def test_an_unknown_cdn_url_fails_naming_the_file_line_and_url(tmp_path):
    site = tmp_path / "site"
    write(site / "index.html", "<html><head>\n<title>x</title>\n<script src='https://cdn.example.com/lib.js'></script>")
    with pytest.raises(OfflinePageError) as err:
        make_offline(site)
    assert err.value.problems == [f"{site / 'index.html'}:3: <script src> https://cdn.example.com/lib.js: "
                                  "loads from another host"]


def test_a_reference_to_a_missing_file_fails(tmp_path):
    site = tmp_path / "site"
    write(site / "pages" / "p.html", page('<link rel="icon" href="../../static/images/favicon.ico">'))
    with pytest.raises(OfflinePageError, match=r"p.html:1: <link href> ../../static/images/favicon.ico: no such file"):
        make_offline(site)


def test_a_version_range_url_never_rewrites_part_of_a_longer_url(tmp_path):
    site = tmp_path / "site"
    head = ('<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>'
            '<script src="https://cdn.jsdelivr.net/npm/vega@5.20.2"></script>'
            '<script src="https://cdn.jsdelivr.net/npm/vega-lite@5"></script>')
    write(site / "index.html", page(head))
    make_offline(site)
    html = (site / "index.html").read_text()
    assert html.count('src="static/web/vega@5.20.2/build/vega.min.js"') == 2
    assert 'src="static/web/vega-lite@5.2.0/build/vega-lite.min.js"' in html


def test_a_page_written_against_the_copies_gets_them(tmp_path):
    site = tmp_path / "site"
    write(site / "index.html", page('<script src="static/web/vega-embed@6.18.2/build/vega-embed.min.js"></script>'))
    make_offline(site)
    assert (site / SITE_ASSETS / "vega-embed@6.18.2" / "build" / "vega-embed.min.js").is_file()
    assert not (site / SITE_ASSETS / "vega@5.20.2").exists()


def test_a_vendored_file_that_differs_from_the_manifest_is_refused(tmp_path, monkeypatch):
    package, path = served_file(POPPER)
    tampered = tmp_path / "assets" / package.spec
    shutil.copytree(package_dir(package), tampered)
    (tampered / path).write_text("window.evil = 1")
    monkeypatch.setattr(offline_pages, "package_dir", lambda p: tampered if p == package else package_dir(p))
    site = tmp_path / "site"
    write(site / "index.html", page(f'<script src="{POPPER}"></script>'))
    with pytest.raises(offline_pages.PipelineError, match="popper.min.js: not the file assets/web/manifest.json"):
        make_offline(site)


def test_page_references_find_every_fetching_attribute_and_style_url(tmp_path):
    html = ('<img srcset="a.png 1x, https://x.org/b.png 2x"><div style="background: url(&quot;c.png&quot;)"></div>'
            "<video poster='d.png'></video><object data='e.svg'></object><a href='f.html'>f</a>"
            "<style>@import 'g.css'; .x { background: url(data:image/png;base64,AAAA) }</style>"
            '<link rel="preconnect" href="https://fonts.example.org"><a href="#top">top</a>')
    refs = page_references(write(tmp_path / "p.html", html))
    assert [ref.url for ref in refs] == ["a.png", "https://x.org/b.png", "c.png", "d.png", "e.svg", "g.css",
                                        "https://fonts.example.org"]
