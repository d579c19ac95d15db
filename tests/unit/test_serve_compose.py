"""The `translate` service of docker/compose.yaml: `mtpipe serve` on the read-only export, non-root, published on
localhost only, healthy when /ready answers 200 (its healthcheck command is run here against a stand-in server),
and given the time to finish requests in flight on `docker stop`. No Docker engine needed."""

from __future__ import annotations

import http.server
import importlib.util
import shlex
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from pipeline.runtime.serve.server import SHUTDOWN_MARGIN_S
from pipeline.runtime.serve.settings import ServeSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
TRANSLATE = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["translate"]


def test_it_serves_the_read_only_export_on_all_interfaces_of_the_container():
    assert TRANSLATE["command"][:2] == ["mtpipe", "serve"]
    options = dict(zip(TRANSLATE["command"][2::2], TRANSLATE["command"][3::2], strict=True))
    assert options["--host"] == "0.0.0.0"
    assert TRANSLATE["volumes"] == [f"${{MT_EXPORT_DIR:-../models/export}}:{options['--model']}:ro"]
    assert TRANSLATE["ports"] == [f"127.0.0.1:${{MT_SERVE_PORT:-8000}}:{options['--port']}"]


def test_it_runs_unprivileged_on_a_read_only_filesystem_without_a_gpu():
    assert TRANSLATE["user"] == "${MT_UID:-1000}:${MT_GID:-1000}"
    assert TRANSLATE["read_only"] is True and TRANSLATE["tmpfs"] == ["/tmp"]
    assert TRANSLATE["security_opt"] == ["no-new-privileges:true"] and TRANSLATE["init"] is True
    assert not TRANSLATE.get("privileged") and "cap_add" not in TRANSLATE and "deploy" not in TRANSLATE


def test_docker_stop_waits_longer_than_a_request_may_take():
    grace = int(TRANSLATE["stop_grace_period"].removesuffix("s"))
    assert grace >= ServeSettings(model_dir=Path("unused")).request_timeout_s + SHUTDOWN_MARGIN_S


@contextmanager
def stand_in(ready_status: int):
    """An HTTP server on a free loopback port answering GET /ready with ready_status."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(ready_status if self.path == "/ready" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("ready_status", "healthy"), [(200, True), (503, False)])
def test_the_healthcheck_passes_exactly_when_ready_answers_200(ready_status, healthy):
    kind, program, flag, code = TRANSLATE["healthcheck"]["test"]
    assert (kind, program, flag) == ("CMD", "python", "-c") and "http://127.0.0.1:8000/ready" in code
    with stand_in(ready_status) as port:
        result = subprocess.run([sys.executable, "-c", code.replace(":8000/", f":{port}/")], capture_output=True)
    assert (result.returncode == 0) == healthy, result.stderr.decode()


def test_the_compose_file_is_valid_against_the_compose_specification():
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema not installed (pip install the dev extra)")
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, shlex.join(command) + "\n" + result.stdout + result.stderr
