"""report.html in a real browser: headless Chromium (Debian's `chromium`) opens it from disk, driven over the
DevTools protocol on a pipe (--remote-debugging-pipe: no port, no websocket library). The page must render
with no script error, no console error (a CSP violation is one), no network request besides the file
itself, the culprit section visible on the first screen, and hostile names shown as text. A screenshot of
each scenario is saved to tests/artifacts/ for a human to look at.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from app.analysis import analyze
from app.report import export_bundle
from test_report_build import HOSTILE_NAME, make_snapshot

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DEADLINE_S = 20.0


def _missing_browser() -> None:
    reason = "Debian's chromium package is not installed (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; env CI is set: this test must run there", pytrace=False)
    pytest.skip(reason)


class DevTools:
    """A minimal DevTools-protocol client over Chromium's pipe (fd 3 in, fd 4 out; messages end with NUL)."""

    def __init__(self, binary: str, profile: Path, deadline: float) -> None:
        self.deadline = deadline
        self.log = profile.with_suffix(".stderr")
        self.to_browser_r, self.to_browser_w = os.pipe()
        self.from_browser_r, self.from_browser_w = os.pipe()
        r, w = self.to_browser_r, self.from_browser_w
        # a tiny exec stage moves the pipe ends to fds 3 and 4, where --remote-debugging-pipe expects them
        # (dash cannot redirect fds above 9, and preexec_fn runs before pass_fds closes the rest)
        wire = ("import os, sys; ends = [int(a) for a in sys.argv[1:3]]; dups = [os.dup(fd) for fd in ends]; "
                "os.dup2(dups[0], 3); os.dup2(dups[1], 4); os.set_inheritable(3, True); os.set_inheritable(4, True); "
                "[os.close(fd) for fd in set(ends + dups) - {3, 4}]; os.execv(sys.argv[3], sys.argv[3:])")
        log = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", wire, str(r), str(w), binary, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
             "--disable-crash-reporter", "--disable-breakpad",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, pass_fds=(r, w),
            start_new_session=True)  # its own process group: close() can sweep renderer/zygote children
        log.close()
        os.close(self.to_browser_r)
        os.close(self.from_browser_w)
        self.buffer = b""
        self.next_id = 0
        self.events: List[Dict[str, Any]] = []

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> Dict[str, Any]:
        self.next_id += 1
        msg: Dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_browser_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> Dict[str, Any]:
        for e in self.events:
            if e.get("method") == method:
                return e
        while True:
            e = self._read()
            self.events.append(e)
            if e.get("method") == method:
                return e

    def _read(self) -> Dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            ready, _, _ = select.select([self.from_browser_r], [], [], max(left, 0))
            if not ready:
                raise AssertionError(f"Chromium did not answer within {DEADLINE_S} s")
            chunk = os.read(self.from_browser_r, 1 << 20)
            if not chunk:
                raise AssertionError("Chromium closed the DevTools pipe: " + self._stderr())
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def _stderr(self) -> str:
        self.proc.kill()
        self.proc.wait(timeout=10)
        return self.log.read_text(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    os.write(self.to_browser_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                    self.proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # any helper process the browser left behind
            except ProcessLookupError:
                pass
            for fd in (self.to_browser_w, self.from_browser_r):
                try:
                    os.close(fd)
                except OSError:
                    pass


VISIBLE_JS = """(() => {
  const c = document.getElementById('culprit');
  const r = c ? c.getBoundingClientRect() : null;
  const s = c ? getComputedStyle(c) : null;
  return {
    culprit: r ? {top: r.top, height: r.height, width: r.width, display: s.display, visibility: s.visibility,
                  text: c.innerText.slice(0, 400)} : null,
    viewport: window.innerHeight,
    scripts: document.scripts.length,
    styled: getComputedStyle(document.querySelector('.verdict')).borderLeftStyle,
    body: document.body.innerText,
    cells: document.querySelectorAll('.cell').length,
  };
})()"""


def open_page(path: Path, profile: Path, screenshot: Optional[Path] = None) -> Dict[str, Any]:
    """Load a file in headless Chromium; returns the requests it made, its errors and VISIBLE_JS's answer."""
    if CHROMIUM is None:
        _missing_browser()
    assert CHROMIUM is not None
    page_url = path.as_uri()
    dt = DevTools(CHROMIUM, profile, time.monotonic() + DEADLINE_S)
    try:
        target = dt.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = dt.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            dt.send(f"{domain}.enable", session=session)
        dt.send("Emulation.setDeviceMetricsOverride",
                {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        dt.events.clear()
        dt.send("Page.navigate", {"url": page_url}, session=session)
        dt.wait_event("Page.loadEventFired")
        state = dt.send("Runtime.evaluate", {"expression": VISIBLE_JS, "returnByValue": True},
                        session=session)["result"]["value"]
        if screenshot is not None:
            shot = dt.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
            screenshot.parent.mkdir(exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot))
        events = list(dt.events)
    finally:
        dt.close()
    requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    errors = [e["params"] for e in events if e.get("method") == "Runtime.exceptionThrown"]
    errors += [e["params"]["entry"] for e in events
               if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]
    errors += [e["params"] for e in events
               if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")]
    return {"url": page_url, "requests": requests, "errors": errors, "state": state}


@pytest.mark.parametrize("scenario", ["dataloader", "hostile"])
def test_report_renders_in_headless_chromium_offline(scenario: str, tmp_path: Path) -> None:
    snap = make_snapshot(scenario, failed_node=True)
    export_bundle(snap, analyze(snap), str(tmp_path / "bundle"))
    started = time.monotonic()
    seen = open_page(tmp_path / "bundle" / "report.html", tmp_path / "profile", ARTIFACTS / f"report-{scenario}.png")
    assert seen["requests"] == [seen["url"]], "the page made network requests"
    assert seen["errors"] == []
    state = seen["state"]
    assert state["scripts"] == 0
    assert state["styled"] == "solid", "the inline stylesheet was blocked (its CSP hash does not match)"
    culprit = state["culprit"]
    assert culprit is not None and culprit["display"] != "none" and culprit["visibility"] == "visible"
    assert culprit["height"] > 50 and 0 <= culprit["top"] < state["viewport"], culprit
    assert "rank 5 on node02" in culprit["text"]
    assert state["cells"] == len(snap.ranks)
    if scenario == "hostile":
        assert HOSTILE_NAME in state["body"]  # shown as text, not parsed as an element
    assert time.monotonic() - started < DEADLINE_S


def test_the_harness_sees_requests_and_errors(tmp_path: Path) -> None:
    """Control: a page that fetches and throws is caught, so the clean result above means something."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><div class=\"verdict\"></div>"
                    "<img src=\"http://127.0.0.1:9/pixel.png\"><script>throw new Error('boom')</script></body></html>")
    seen = open_page(page, tmp_path / "profile")
    assert "http://127.0.0.1:9/pixel.png" in seen["requests"]
    assert any("boom" in json.dumps(e) for e in seen["errors"])
    assert seen["state"]["culprit"] is None
