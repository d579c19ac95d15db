"""The web assets the project's pages load, as npm packages: which CDN URL is answered by which package file.

Great Expectations' Data Docs and DVC's plots page load Bootstrap, jQuery, bootstrap-table, Font Awesome, vega
and friends from CDNs, and FastAPI's /docs page Swagger UI (`mtpipe serve` serves that one itself:
pipeline/runtime/serve/docs.py). Each of those URLs names an npm package at a pinned version; `assets/web/fetch.py`
takes exactly the files below from the registry's tarballs (`npm pack`) into `assets/web/<package>@<version>/` and
records their sha256 in `assets/web/manifest.json`, and `pipeline.offline_pages` copies them beside a page and
points the page at them.

Where a CDN URL names a version range rather than a version (GX's `vega@5`), or a non-minified file, the file
served is the one named in the comment: one copy then serves both pages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WEB_ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "web"
MANIFEST = WEB_ASSETS_DIR / "manifest.json"
# Where a page's copies go, relative to the site's root directory (GX's site keeps its own files in static/ too).
SITE_ASSETS = Path("static") / "web"


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    # (URL a page loads, the package file that answers it)
    serves: tuple[tuple[str, str], ...]
    # Package files the served ones load in turn (Font Awesome's stylesheet loads its webfonts).
    loads: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        """`name@version`, as npm takes it and as the package's directory is named."""
        return f"{self.name}@{self.version}"

    @property
    def files(self) -> list[str]:
        return sorted({path for _, path in self.serves} | set(self.loads))


UNPKG, JSDELIVR, CDNJS = "https://unpkg.com", "https://cdn.jsdelivr.net/npm", "https://cdnjs.cloudflare.com/ajax/libs"

PACKAGES: tuple[NpmPackage, ...] = (
    NpmPackage("bootstrap", "4.3.1", (
        ("https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css", "dist/css/bootstrap.min.css"),
        ("https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js", "dist/js/bootstrap.min.js"),
    )),
    NpmPackage("jquery", "3.7.1", (("https://code.jquery.com/jquery-3.7.1.min.js", "dist/jquery.min.js"),)),
    NpmPackage("popper.js", "1.12.9", ((f"{CDNJS}/popper.js/1.12.9/umd/popper.min.js", "dist/umd/popper.min.js"),)),
    NpmPackage("bootstrap-table", "1.19.1", (
        (f"{UNPKG}/bootstrap-table@1.19.1/dist/bootstrap-table.min.css", "dist/bootstrap-table.min.css"),
        (f"{UNPKG}/bootstrap-table@1.19.1/dist/bootstrap-table.min.js", "dist/bootstrap-table.min.js"),
        (f"{UNPKG}/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
         "dist/extensions/filter-control/bootstrap-table-filter-control.min.js"),
    )),
    # GX's pages take the filter-control stylesheets from 1.19.0 and everything else from 1.19.1.
    NpmPackage("bootstrap-table", "1.19.0", (
        (f"{UNPKG}/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css",
         "dist/extensions/filter-control/bootstrap-table-filter-control.css"),
        (f"{UNPKG}/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
         "dist/extensions/filter-control/bootstrap-table-filter-control.min.css"),
    )),
    NpmPackage("bootstrap-datepicker", "1.9.0", (
        (f"{CDNJS}/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css",
         "dist/css/bootstrap-datepicker.min.css"),
        (f"{CDNJS}/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js", "dist/js/bootstrap-datepicker.min.js"),
    )),
    # GX loads the non-minified stylesheet (880 kB); the package's minified build of it is served instead.
    NpmPackage("@forevolve/bootstrap-dark", "1.1.0", (
        (f"{JSDELIVR}/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css",
         "dist/css/bootstrap-prefers-dark.min.css"),
    )),
    NpmPackage(
        "@fortawesome/fontawesome-free", "6.6.0",
        ((f"{CDNJS}/font-awesome/6.6.0/css/all.min.css", "css/all.min.css"),),
        loads=tuple(f"webfonts/{font}.{ext}" for font in ("fa-brands-400", "fa-regular-400", "fa-solid-900",
                                                           "fa-v4compatibility") for ext in ("woff2", "ttf")),
    ),
    # DVC 3.67's plots page pins these three; GX's pages ask for vega@5, vega-lite@5 and vega-embed@6 (any
    # release of those majors), answered by the same files. A bare jsDelivr package URL serves the file its
    # package.json names under "jsdelivr": build/<name>.min.js.
    NpmPackage("vega", "5.20.2", (
        (f"{JSDELIVR}/vega@5.20.2", "build/vega.min.js"),
        (f"{JSDELIVR}/vega@5", "build/vega.min.js"),
    )),
    NpmPackage("vega-lite", "5.2.0", (
        (f"{JSDELIVR}/vega-lite@5.2.0", "build/vega-lite.min.js"),
        (f"{JSDELIVR}/vega-lite@5", "build/vega-lite.min.js"),
    )),
    NpmPackage("vega-embed", "6.18.2", (
        (f"{JSDELIVR}/vega-embed@6.18.2", "build/vega-embed.min.js"),
        (f"{JSDELIVR}/vega-embed@6", "build/vega-embed.min.js"),
    )),
    # FastAPI's /docs page asks for any 5.x release; its favicon, on FastAPI's own site, is replaced by the package's.
    NpmPackage("swagger-ui-dist", "5.35.0", (
        (f"{JSDELIVR}/swagger-ui-dist@5/swagger-ui-bundle.js", "swagger-ui-bundle.js"),
        (f"{JSDELIVR}/swagger-ui-dist@5/swagger-ui.css", "swagger-ui.css"),
    ), loads=("favicon-32x32.png",)),
)


def package_dir(package: NpmPackage, root: Path = WEB_ASSETS_DIR) -> Path:
    return root / package.spec


def served_file(url: str) -> tuple[NpmPackage, str] | None:
    """The package and file that answer `url`, or None when no vendored package does."""
    for package in PACKAGES:
        for served_url, path in package.serves:
            if served_url == url:
                return package, path
    return None


def vendored_files(package: NpmPackage) -> dict[str, str]:
    """{file: sha256} of one package as `assets/web/manifest.json` records it (its files plus its license)."""
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    try:
        return manifest["packages"][package.spec]["files"]
    except KeyError:
        raise KeyError(f"{MANIFEST}: no entry for {package.spec}: run `python assets/web/fetch.py`") from None
