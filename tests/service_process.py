"""`mtpipe serve` as a child process on a free loopback port, ready when the context is entered: the real service
(its own process, its own HTTP stack) rather than the app in-process, as the e2e tests and bench/serve.py call it.

    with ServiceProcess(export_dir, "--workers", "2") as service:
        urlopen(service.url + "/ready")

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# The line server.serve logs once the socket is bound ("... on http://127.0.0.1:PORT").
LISTENING = re.compile(r"serving .* on (http://\S+)$", re.MULTILINE)
# No proxy from the environment: the service is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServiceFailed(RuntimeError):
    """The service exited or did not get ready; the message holds its log."""


class ServiceProcess:
    def __init__(self, model_dir: str | os.PathLike[str], *args: str, start_timeout_s: float = 60.0):
        model = Path(model_dir).resolve()  # the child runs in the repository, not in the caller's directory
        self.command = [sys.executable, "-m", "pipeline.tools.cli", "serve", "--model", str(model),
                        "--host", "127.0.0.1", "--port", "0", *args]
        self.start_timeout_s = start_timeout_s
        self.url = ""
        self.process: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")

    def __enter__(self) -> ServiceProcess:
        repo = Path(__file__).resolve().parents[1]
        self.process = subprocess.Popen(self.command, cwd=repo, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceFailed(f"`mtpipe serve` exited with {self.process.returncode}:\n{self.log()}")
            if not self.url and (match := LISTENING.search(self.log())):
                self.url = match[1]
            if self.url and self._ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise ServiceFailed(f"`mtpipe serve` not ready after {self.start_timeout_s} s:\n{self.log()}")

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()

    def _ready(self) -> bool:
        try:
            return self.get("/ready")[0] == 200
        except OSError:  # refused until uvicorn listens
            return False

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """(status, body) of a GET; 4xx/5xx are returned, not raised."""
        try:
            with _OPENER.open(self.url + path, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def post_json(self, path: str, body: Any, timeout: float = 60.0) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode("utf-8"),
                                         headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def log(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def send_signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then wait (SIGKILL after timeout_s); the exit status."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
