"""Make a directory of HTML pages work offline: the web assets they load from CDNs copied beside them, their URLs
rewritten to the copies, and a check that nothing they load comes from another host.

`make_offline(site_dir)`, run on a finished site (Great Expectations' Data Docs, the page `dvc plots show`
writes):
1. finds what each page loads: `src`/`href` of the tags that fetch (script, link, img, iframe, source, ...), the
   `url()`s and `@import`s of its styles. Links a reader follows (`<a href>`) load nothing and are left alone;
2. rewrites each CDN URL that a package of `pipeline.runtime.web_assets` serves to a relative path to its copy in
   `<site>/static/web/<package>@<version>/`, and each URL of `local_urls` to a file already in the site. Tags
   it rewrote lose `integrity` and `crossorigin`: a page opened from disk has no origin, so the browser cannot
   run the CORS request those attributes ask for and would refuse the file (the copies' sha256 are checked
   against `assets/web/manifest.json` instead);
3. copies the packages the pages now use (and only those) into `<site>/static/web/`;
4. raises `OfflinePageError` naming the file, line and URL of anything a page or a copied stylesheet would still
   fetch from another host, and of every relative reference that names no file in the site.

Only the standard library: the validate stage and `mtpipe plots` call it after GX or DVC wrote their HTML.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.web_assets import PACKAGES, SITE_ASSETS, NpmPackage, package_dir, served_file, vendored_files

# Tag -> the attributes through which it fetches something (srcset holds several URLs).
FETCHING_ATTRIBUTES = {
    "script": ("src",),
    "link": ("href",),  # stylesheets, icons, but also preload/prefetch/preconnect: every <link> reaches its href
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "frame": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "source": ("src", "srcset"),
    "audio": ("src",),
    "video": ("src", "poster"),
    "track": ("src",),
    "input": ("src",),
}
CSS_URL = re.compile(
    r"""url\(\s*(?P<quote>['"]?)(?P<url>.*?)(?P=quote)\s*\)|@import\s+(?P<q2>['"])(?P<url2>.*?)(?P=q2)""", re.DOTALL
)
# References that never fetch a file: fragments, inline data, script pseudo-URLs.
INERT_PREFIXES = ("#", "data:", "javascript:", "about:", "mailto:", "blob:")


class OfflinePageError(PipelineError):
    def __init__(self, site_dir: Path, problems: list[str]):
        listed = "\n".join(f"  {problem}" for problem in problems)
        super().__init__(f"{site_dir}: {len(problems)} reference(s) would not load offline:\n{listed}")
        self.problems = problems


@dataclass(frozen=True)
class Reference:
    """One URL a page or stylesheet fetches, where it stands (file and line) and through what (tag attribute)."""

    url: str
    file: Path
    line: int
    via: str

    @property
    def is_external(self) -> bool:
        return self.url.startswith(("http://", "https://", "//"))

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.via} {self.url}"


def css_references(css: str, file: Path, first_line: int = 1, via: str = "url()") -> list[Reference]:
    found = []
    for match in CSS_URL.finditer(css):
        url = (match.group("url") if match.group("url") is not None else match.group("url2")).strip()
        line = first_line + css.count("\n", 0, match.start())
        found.append(Reference(url, file, line, "@import" if match.group("url2") is not None else via))
    return [ref for ref in found if ref.url and not ref.url.startswith(INERT_PREFIXES)]


class _FetchCollector(HTMLParser):
    def __init__(self, file: Path):
        super().__init__(convert_charrefs=True)
        self.file = file
        self.references: list[Reference] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        line = self.getpos()[0]
        values = dict(attrs)
        for name in FETCHING_ATTRIBUTES.get(tag, ()):
            value = (values.get(name) or "").strip()
            urls = [part.split()[0] for part in value.split(",") if part.strip()] if name == "srcset" else [value]
            self.references += [Reference(url, self.file, line, f"<{tag} {name}>") for url in urls if url]
        if values.get("style"):
            self.references += css_references(values["style"] or "", self.file, line, f"<{tag} style> url()")
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.references += css_references(data, self.file, self.getpos()[0], "<style> url()")


def page_references(page: Path, text: str | None = None) -> list[Reference]:
    """What an HTML page fetches (inert references such as `#top` or `data:` left out)."""
    collector = _FetchCollector(page)
    collector.feed(page.read_text(encoding="utf-8") if text is None else text)
    collector.close()
    return [ref for ref in collector.references if not ref.url.startswith(INERT_PREFIXES)]


def _without_query(url: str) -> str:
    return url.split("?", 1)[0].split("#", 1)[0]


def _relative(target: Path, page: Path) -> str:
    return Path(os.path.relpath(target, page.parent)).as_posix()


def _strip_cors_attributes(text: str) -> str:
    """Drop integrity and crossorigin from every <script>/<link> tag that loads a local file."""

    def local_tag(match: re.Match[str]) -> str:
        tag = match.group(0)
        source = re.search(r"""\s(?:src|href)\s*=\s*["']?([^"'\s>]+)""", tag)
        if source is None or source.group(1).startswith(("http://", "https://", "//")):
            return tag
        return re.sub(r"""\s(?:integrity|crossorigin)(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]+))?""", "", tag)

    return re.sub(r"<(?:script|link)\b[^>]*>", local_tag, text, flags=re.IGNORECASE)


def rewrite_page(page: Path, site_dir: Path, local_urls: dict[str, str]) -> set[NpmPackage]:
    """Point `page`'s CDN and `local_urls` references at files in the site; returns the packages it now uses."""
    text = page.read_text(encoding="utf-8")
    used: set[NpmPackage] = set()
    replacements: dict[str, str] = {}
    for ref in page_references(page, text):
        if not ref.is_external:
            continue
        served = served_file(ref.url)
        if served is not None:
            package, path = served
            used.add(package)
            replacements[ref.url] = _relative(site_dir / SITE_ASSETS / package.spec / path, page)
        elif _without_query(ref.url) in local_urls:
            replacements[ref.url] = _relative(site_dir / local_urls[_without_query(ref.url)], page)
    # Longest first and bounded by the attribute's quote or the url()'s parenthesis, so `vega@5` never rewrites
    # part of `vega@5.20.2`.
    for url in sorted(replacements, key=len, reverse=True):
        text = re.sub(re.escape(url) + r"""(?=["')\s>])""", lambda _m, new=replacements[url]: new, text)
    page.write_text(_strip_cors_attributes(text), encoding="utf-8")
    return used


def copy_package(package: NpmPackage, site_dir: Path) -> None:
    """Copy one vendored package into the site, each file checked against its sha256 in the manifest."""
    source, target = package_dir(package), site_dir / SITE_ASSETS / package.spec
    for name, sha256 in vendored_files(package).items():
        data = (source / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise PipelineError(f"{source / name}: not the file assets/web/manifest.json records (sha256 differs); "
                                "restore it or run `python assets/web/fetch.py`")
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)


def _packages_referenced(references: Iterable[Reference], site_dir: Path) -> set[NpmPackage]:
    """Packages whose site copy a reference points into (a page written against static/web/ directly)."""
    assets = (site_dir / SITE_ASSETS).resolve()
    by_dir = {(assets / package.spec): package for package in PACKAGES}
    used = set()
    for ref in references:
        if ref.is_external:
            continue
        target = (ref.file.parent / unquote(_without_query(ref.url))).resolve()
        used |= {package for directory, package in by_dir.items() if target.is_relative_to(directory)}
    return used


def offline_problems(site_dir: Path, files: Iterable[Path]) -> list[str]:
    """Every external or dangling reference of the given pages (.html) and stylesheets (.css)."""
    problems = []
    for file in files:
        if file.suffix == ".css":
            refs = css_references(file.read_text(encoding="utf-8", errors="replace"), file)
        else:
            refs = page_references(file)
        for ref in refs:
            if ref.is_external:
                problems.append(f"{ref}: loads from another host")
            elif ref.url.startswith("/"):
                problems.append(f"{ref}: an absolute path names no file of the site when opened from disk")
            elif not (file.parent / unquote(_without_query(ref.url))).is_file():
                problems.append(f"{ref}: no such file")
    return problems


def make_offline(site_dir: Path, local_urls: dict[str, str] | None = None) -> list[Path]:
    """Rewrite, copy and check the HTML pages under `site_dir` (see the module docstring); returns the pages.

    `local_urls` maps URLs (matched without their query string) to files the site already holds, relative to
    `site_dir`, for assets no npm package ships (GX's logos).
    """
    assets = site_dir / SITE_ASSETS
    pages = sorted(p for p in site_dir.rglob("*.html") if not p.is_relative_to(assets))
    used: set[NpmPackage] = set()
    for page in pages:
        used |= rewrite_page(page, site_dir, local_urls or {})
    used |= _packages_referenced((ref for page in pages for ref in page_references(page)), site_dir)
    shutil.rmtree(assets, ignore_errors=True)
    for package in sorted(used, key=lambda p: p.spec):
        copy_package(package, site_dir)
    problems = offline_problems(site_dir, [*pages, *sorted(assets.rglob("*.css"))])
    if problems:
        raise OfflinePageError(site_dir, problems)
    return pages
