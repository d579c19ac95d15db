"""The page checker sees what a person would: it blocks and reports requests to other hosts, reports files that do
not load and console errors, and saves a screenshot. Skipped where no Chromium is installed."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from tests.page_check import check_page, find_chromium, is_local, main

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no Chromium (apt-get install chromium)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write(path: Path, html: str) -> Path:
    path.write_text(html, encoding="utf-8")
    return path


def test_local_means_this_machine_or_the_pages_own_files():
    assert is_local("file:///tmp/x.css") and is_local("data:image/png;base64,AA") and is_local("about:blank")
    assert is_local("http://127.0.0.1:8000/x.js") and is_local("http://localhost/x") and is_local("http://[::1]:80/")
    assert not is_local("https://cdn.jsdelivr.net/npm/vega@5") and not is_local("http://10.0.0.1/x.png")


@needs_chromium
def test_a_page_that_loads_only_its_own_files_passes_and_is_photographed(tmp_path):
    (tmp_path / "style.css").write_text("h1 { color: rgb(200, 0, 0); }")
    page = write(tmp_path / "ok.html", '<link rel="stylesheet" href="style.css"><h1>Fine</h1>'
                                       "<script>document.title = 'drawn'</script>")
    result = check_page(page, tmp_path / "shots" / "ok.png", ready_expression="document.title === 'drawn'",
                        width=400, height=300)
    assert result.problems == []
    assert result.screenshot.read_bytes().startswith(PNG_MAGIC)


@needs_chromium
def test_requests_to_other_hosts_are_blocked_and_reported_with_failed_files_and_console_errors(tmp_path):
    page = write(tmp_path / "bad.html",
                 '<script src="https://cdn.jsdelivr.net/npm/vega@5"></script><img src="http://10.0.0.1/x.png">'
                 '<link rel="stylesheet" href="missing.css"><script>console.error("boom"); notDefined();</script>')
    result = check_page(page)
    assert sorted(result.external_requests) == ["http://10.0.0.1/x.png", "https://cdn.jsdelivr.net/npm/vega@5"]
    assert [f for f in result.failed_requests if "missing.css" in f] == [f"{(tmp_path / 'missing.css').as_uri()} "
                                                                        "(net::ERR_FILE_NOT_FOUND)"]
    assert "boom" in result.console_errors
    assert any("ReferenceError: notDefined is not defined" in e for e in result.console_errors)
    assert len(result.problems) >= 5


@needs_chromium
def test_a_page_served_on_this_machine_may_load_from_it(tmp_path):
    (tmp_path / "app.js").write_text("document.body.dataset.loaded = 'yes';")
    # The icon link: a browser asks a server for /favicon.ico otherwise, and its 404 is a console error too.
    write(tmp_path / "index.html", '<link rel="icon" href="data:,"><body><script src="/app.js"></script></body>')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = check_page(f"http://127.0.0.1:{server.server_port}/index.html",
                            ready_expression="document.body.dataset.loaded === 'yes'", timeout_s=20)
    finally:
        server.shutdown()
    assert result.problems == []


@needs_chromium
def test_the_command_exits_1_on_a_page_with_problems_and_0_on_a_clean_one(tmp_path, capsys):
    assert main([str(write(tmp_path / "ok.html", "<p>ok</p>"))]) == 0
    assert main([str(write(tmp_path / "bad.html", "<script>throw new Error('broken')</script>"))]) == 1
    assert "bad.html: console error: Error: broken" in capsys.readouterr().err


def test_a_missing_page_is_an_error_naming_it(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere.html")]) == 2
    assert "nowhere.html: no such page" in capsys.readouterr().err


@needs_chromium
def test_a_page_that_never_draws_what_it_should_is_reported_as_unsettled(tmp_path):
    page = write(tmp_path / "blank.html", "<div id='chart'></div>")
    result = check_page(page, ready_expression="document.querySelector('#chart svg') !== null", timeout_s=2)
    assert result.problems == ["did not settle: not within 2 s (nothing loading, or "
                               "`document.querySelector('#chart svg') !== null` never held)"]
