"""Open a page as a person would, in headless Chromium with the network cut off, and say what went wrong.

`check_page(page, screenshot)` loads a file (or a URL on this machine) in a fresh headless Chromium, waits until
the page has settled, saves a PNG of what a reader first sees, and returns what that reader would have met:
requests to another host (blocked, never sent), requests that failed (a missing file), and console errors
(uncaught exceptions included). A page passes when all three are empty.

Chromium is driven through its DevTools protocol over a pipe (`--remote-debugging-pipe`: JSON messages ending in
a NUL byte, read from file descriptor 3 and written to 4), so this needs only the standard library and a
Chromium on the machine (Debian: `apt-get install chromium`), never a browser download. The network is cut off
twice: every request of the page is paused by the DevTools Fetch domain and failed before it is sent unless it
stays on this machine, and the browser's proxy is a closed local port, so a request that escaped the first net
would still not leave.

    python -m tests.page_check reports/eval/index.html --screenshot docs/img/eval.png
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# Schemes that never reach the network: the page's own files and what its scripts build in memory.
LOCAL_SCHEMES = ("file", "data", "blob", "about")
# Flags for a headless browser that runs as root in a container and starts nothing on its own that talks to the
# network (sync, component updates, background fetches, QUIC).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
    # Port 9 (discard) on the loopback: nothing is served there, so a proxied request fails at once. Chromium
    # never proxies loopback addresses, so pages served on this machine still load.
    "--proxy-server=http://127.0.0.1:9",
    "--remote-debugging-pipe",
)

FD_TRAMPOLINE = (
    "import os, sys; read, write = map(int, sys.argv[1:3]); os.dup2(read, 3); os.dup2(write, 4); "
    "os.close(read); os.close(write); os.execv(sys.argv[3], sys.argv[3:])"
)


class BrowserError(RuntimeError):
    """Chromium could not be started, or stopped answering."""


def find_chromium() -> str | None:
    """The Chromium to use: $MTPIPE_CHROMIUM, else the first of CHROMIUM_NAMES on the PATH."""
    explicit = os.environ.get("MTPIPE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@dataclass
class PageCheck:
    """What loading one page met. `problems` is empty for a page a person can read offline."""

    page: str
    external_requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    unsettled: str | None = None  # why the page had not settled when the time was up
    screenshot: Path | None = None

    @property
    def problems(self) -> list[str]:
        return (
            [f"request to another host (blocked): {url}" for url in self.external_requests]
            + [f"failed request: {failure}" for failure in self.failed_requests]
            + [f"console error: {message}" for message in self.console_errors]
            + ([f"did not settle: {self.unsettled}"] if self.unsettled else [])
        )


def is_local(url: str, allowed_hosts: tuple[str, ...] = LOCAL_HOSTS) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return (parts.hostname or "") in allowed_hosts


def _above_ten(fd: int) -> int:
    """The same pipe end as `fd` on a descriptor of at least 10 (`fd` is closed)."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class DevToolsPipe:
    """One Chromium process and its DevTools pipe: commands out, replies and events in (in arrival order)."""

    def __init__(self, chromium: str, user_data_dir: Path):
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # A small Python trampoline moves the browser's two pipe ends onto descriptors 3 and 4, where Chromium
        # expects them, and execs it (a shell would do, but dash takes only one-digit descriptors). They are
        # first moved to 10 and above so that neither already is 3 or 4 and gets overwritten by the other.
        to_browser_read, from_browser_write = (_above_ten(fd) for fd in (to_browser_read, from_browser_write))
        command = [sys.executable, "-c", FD_TRAMPOLINE, str(to_browser_read), str(from_browser_write),
                   chromium, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}"]
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(to_browser_read, from_browser_write),
                # Its own process group: close() ends the renderers and helpers with it.
                start_new_session=True,
            )
        finally:
            os.close(to_browser_read)
            os.close(from_browser_write)
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: list[bytes] = []
        self._readers = [threading.Thread(target=self._read_messages, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()
        self._next_id = 0

    def _read_messages(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\0")
            for raw in complete:
                self.messages.put(json.loads(raw))
        self.messages.put(None)  # the browser closed its end: it exited

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._stderr.append(line)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        """Send a command without waiting for its reply; returns its id."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._to_browser, data):]
        return self._next_id

    def next_message(self, timeout_s: float) -> dict[str, Any] | None:
        """The next reply or event, or None when nothing came within `timeout_s`."""
        try:
            message = self.messages.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if message is None:
            tail = b"".join(self._stderr[-5:]).decode(errors="replace")
            raise BrowserError(f"Chromium exited (status {self.process.wait()}): {tail}")
        return message

    def close(self) -> None:
        """Ask the browser to quit, wait for it, then end whatever of its process group is left."""
        try:
            self.send("Browser.close")
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.terminate()
            self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already gone
        for reader in self._readers:  # both reach the end of their pipe now that the browser is gone
            reader.join(timeout=5)
        os.close(self._to_browser)
        os.close(self._from_browser)


class PageSession:
    """One tab: sends commands to it and turns the events it reports into a PageCheck while waiting."""

    def __init__(self, pipe: DevToolsPipe, check: PageCheck, allowed_hosts: tuple[str, ...]):
        self.pipe, self.check, self.allowed_hosts = pipe, check, allowed_hosts
        self.session: str | None = None
        self.in_flight: dict[str, str] = {}  # request id -> url
        self.blocked: set[str] = set()
        self.loaded = False
        self.last_activity = time.monotonic()

    def call(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
        """Send a command and handle events until its reply comes."""
        command_id = self.pipe.send(method, params, self.session)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            message = self.pipe.next_message(left)
            if message is None:
                break
            if message.get("id") == command_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            self.handle(message)
        raise BrowserError(f"{method}: no reply within {timeout_s:.0f} s")

    def pump(self, seconds: float) -> None:
        """Handle events for `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            message = self.pipe.next_message(left)
            if message is not None:
                self.handle(message)

    def handle(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method is None or message.get("sessionId") != self.session:
            return  # a reply nobody waits for (continueRequest), or the browser's own events
        self.last_activity = time.monotonic()
        if method == "Fetch.requestPaused":
            url = params["request"]["url"]
            if is_local(url, self.allowed_hosts):
                self.pipe.send("Fetch.continueRequest", {"requestId": params["requestId"]}, self.session)
            else:
                self.check.external_requests.append(url)
                self.blocked.add(url)
                failure = {"requestId": params["requestId"], "errorReason": "BlockedByClient"}
                self.pipe.send("Fetch.failRequest", failure, self.session)
        elif method == "Network.requestWillBeSent":
            self.in_flight[params["requestId"]] = params["request"]["url"]
        elif method == "Network.loadingFinished":
            self.in_flight.pop(params["requestId"], None)
        elif method == "Network.loadingFailed":
            url = self.in_flight.pop(params["requestId"], "?")
            if url not in self.blocked and not params.get("canceled"):
                self.check.failed_requests.append(f"{url} ({params.get('errorText', 'failed')})")
        elif method == "Page.loadEventFired":
            self.loaded = True
        else:
            self._console(method, params)

    def _console(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
            self.check.console_errors.append(text)
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            description = details.get("exception", {}).get("description") or details.get("text", "")
            self.check.console_errors.append(f"{description} ({details.get('url', '')}:{details.get('lineNumber')})")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            self.check.console_errors.append(f"{entry.get('text', '')} {entry.get('url', '')}".strip())

    def is_ready(self, ready_expression: str | None) -> bool:
        expression = f"document.readyState === 'complete' && Boolean({ready_expression or 'true'})"
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result.get("result", {}).get("value") is True


def page_url(page: str | os.PathLike[str]) -> str:
    text = str(page)
    if urlsplit(text).scheme in ("http", "https", "file"):
        return text
    path = Path(text).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such page")
    return path.as_uri()


def open_page(tab: PageSession, url: str, width: int, height: int) -> None:
    """Attach to a new tab, switch on the domains that report what the page does, and navigate to `url`."""
    target = tab.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    tab.session = tab.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        tab.call(f"{domain}.enable")
    tab.call("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]})
    tab.call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    navigation = tab.call("Page.navigate", {"url": url})
    if navigation.get("errorText"):
        tab.check.failed_requests.append(f"{url} ({navigation['errorText']})")


def wait_until_settled(tab: PageSession, ready_expression: str | None, timeout_s: float, quiet_s: float = 0.5) -> None:
    """Until the load event fired, `ready_expression` holds, nothing is loading and no event came for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tab.pump(0.1)
        quiet = time.monotonic() - tab.last_activity >= quiet_s
        if tab.loaded and not tab.in_flight and quiet and tab.is_ready(ready_expression):
            return
    still = ", ".join(sorted(tab.in_flight.values())) or "nothing loading"
    ready = "" if ready_expression is None else f", or `{ready_expression}` never held"
    tab.check.unsettled = f"not within {timeout_s:.0f} s ({still}{ready})"


def check_page(
    page: str | os.PathLike[str],
    screenshot: Path | None = None,
    *,
    ready_expression: str | None = None,
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS,
    width: int = 1280,
    height: int = 800,
    scale: float = 1.0,
    timeout_s: float = 30.0,
    chromium: str | None = None,
) -> PageCheck:
    """Load `page` (a path, or an http(s) URL on one of `allowed_hosts`) and report what a reader would meet.

    `ready_expression` is JavaScript that holds once the page has drawn what it draws late (a chart); the
    screenshot is the first `width` x `height` CSS pixels, scaled by `scale`.
    """
    url = page_url(page)
    browser = chromium or find_chromium()
    if browser is None:
        raise BrowserError(f"no Chromium found (looked for $MTPIPE_CHROMIUM and {', '.join(CHROMIUM_NAMES)})")
    check = PageCheck(page=url)
    # A fresh profile each time, removed after the browser's whole process group has ended.
    profile = tempfile.mkdtemp(prefix="mtpipe-chromium-")
    try:
        pipe = DevToolsPipe(browser, Path(profile))
        try:
            tab = PageSession(pipe, check, allowed_hosts)
            open_page(tab, url, width, height)
            wait_until_settled(tab, ready_expression, timeout_s)
            if screenshot is not None:
                clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": scale}
                shot = tab.call("Page.captureScreenshot", {"format": "png", "clip": clip})
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                check.screenshot = screenshot
        finally:
            pipe.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.page_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("page", help="an HTML file, or an http(s) URL on this machine")
    parser.add_argument("--screenshot", type=Path, help="write a PNG of the first screen here")
    parser.add_argument("--ready", help="JavaScript that holds once the page has drawn (e.g. a chart's svg exists)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--scale", type=float, default=1.0, help="screenshot scale (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        result = check_page(args.page, args.screenshot, ready_expression=args.ready, width=args.width,
                            height=args.height, scale=args.scale)
    except (BrowserError, FileNotFoundError) as err:
        print(f"page_check: {err}", file=sys.stderr)
        return 2
    for problem in result.problems:
        print(f"{result.page}: {problem}", file=sys.stderr)
    if not result.problems:
        print(f"{result.page}: no external request, no failed request, no console error"
              + (f"; screenshot {result.screenshot}" if result.screenshot else ""))
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
