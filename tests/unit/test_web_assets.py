"""The vendored web assets are exactly the npm files the manifest records, and they answer every CDN URL the pages
of the installed Great Expectations and DVC load."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest

from pipeline.runtime.web_assets import MANIFEST, PACKAGES, WEB_ASSETS_DIR, package_dir, served_file

MANIFEST_DATA = json.loads(MANIFEST.read_text(encoding="utf-8"))
# Besides the packages: the fetch script, its manifest, the plots page template and a .gitignore.
OWN_FILES = {"fetch.py", "manifest.json", "plots.html", ".gitignore"}
LICENSES = {"LICENSE", "LICENSE.txt", "LICENSE.md"}


def test_every_vendored_file_has_the_sha256_the_manifest_records():
    for package in PACKAGES:
        for name, sha256 in MANIFEST_DATA["packages"][package.spec]["files"].items():
            data = (package_dir(package) / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == sha256, f"{package.spec}/{name}"


def test_the_manifest_holds_the_listed_files_of_the_listed_packages_and_nothing_else():
    assert set(MANIFEST_DATA["packages"]) == {package.spec for package in PACKAGES}
    for package in PACKAGES:
        recorded = set(MANIFEST_DATA["packages"][package.spec]["files"])
        assert set(package.files) <= recorded, package.spec
        assert recorded - set(package.files) <= LICENSES, package.spec
        assert MANIFEST_DATA["packages"][package.spec]["tarball_integrity"].startswith("sha512-")
    on_disk = {p.relative_to(WEB_ASSETS_DIR).as_posix() for p in WEB_ASSETS_DIR.rglob("*") if p.is_file()}
    recorded = {f"{spec}/{name}" for spec, entry in MANIFEST_DATA["packages"].items() for name in entry["files"]}
    assert on_disk - recorded == OWN_FILES


def test_the_assets_stay_small():
    total = sum(p.stat().st_size for p in WEB_ASSETS_DIR.rglob("*") if p.is_file())
    assert total < 6_000_000  # Swagger UI for the service's /docs is 1.9 MB of it


def gx_template(name: str) -> str:
    import great_expectations

    return (Path(great_expectations.__file__).parent / "render" / "view" / "templates" / name).read_text()


def test_every_cdn_url_of_the_installed_gx_and_dvc_pages_is_served():
    from dvc_render.vega import VegaRenderer

    loaded = re.compile(r"""(?:src|href)=["'](https://[^"']+)["']""")
    urls = set(loaded.findall(VegaRenderer.SCRIPTS))
    for template in ("page.j2", "index_page.j2", "js_script_imports.j2"):
        urls |= set(loaded.findall(gx_template(template)))
    assert len(urls) >= 16
    missing = sorted(url for url in urls if served_file(url) is None)
    assert missing == []


@pytest.mark.parametrize("url", ["https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js",
                                 "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js"])
def test_files_gx_pins_by_integrity_hash_are_the_very_files_it_pins(url):
    # GX's <script> tags carry the SRI hash of the CDN file: the vendored copy must hash the same.
    tag = next(line for line in gx_template("js_script_imports.j2").splitlines() if url in line)
    algorithm, expected = re.search(r'integrity="(sha\d+)-([^"]+)"', tag).groups()
    package, path = served_file(url)
    digest = hashlib.new(algorithm, (package_dir(package) / path).read_bytes()).digest()
    assert base64.b64encode(digest).decode() == expected
