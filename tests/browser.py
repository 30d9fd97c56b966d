"""Headless Chromium for the UI tests, driven over the DevTools protocol: open a page, wait
until its text shows what we look for (single-page apps render long after load), read the
text and take a screenshot. Chromium comes from Debian's packages."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

# Texts only MLflow's GenAI side shows, as its releases word them: 3.17's traces page ("Detect
# Issues", an empty chart's line), 3.18's overview (its sidebar's "Observability" group, the
# first-trace guide). A page of the model-training side shows none of them.
GENAI_ONLY = ("Detect Issues", "No data available for the selected time range", "Observability",
              "Send your first trace")


def find_chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)


def ensure_chromium() -> tuple[str | None, str]:
    """Chromium's path, or (None, why): ``.ci/run`` installs it; the tests install nothing."""
    found = find_chromium()
    if found:
        return found, ""
    return None, "chromium is not installed (apt-get install -y chromium, as .ci/run does)"


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, binary: str, width: int = 1600, height: int = 1200):
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10).read())
        page = next(t for t in targets if t.get("type") == "page")
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._id = 0

    def call(self, method: str, **params: object) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        result = self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
        return str(result.get("result", {}).get("value", ""))

    def wait_for(self, *needles: str, any_of: tuple[str, ...] = (), timeout: float = 90.0) -> str:
        """The page's text once it holds every needle, and one of ``any_of`` when given (a text
        that UI releases word differently); raises with the text seen otherwise."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles) and (not any_of or any(n in text for n in any_of)):
                return text
            time.sleep(1.0)
        also = f" and one of {any_of}" if any_of else ""
        raise AssertionError(f"page never showed {needles}{also}; it shows:\n{text[:3000]}")

    def texts(self, css: str) -> list[str]:
        """The text of each element that matches a CSS selector, in document order."""
        script = f"[...document.querySelectorAll({json.dumps(css)})].map(e => e.innerText.trim())"
        result = self.call("Runtime.evaluate", expression=script, returnByValue=True)
        return list(result.get("result", {}).get("value") or [])

    def wait_for_texts(self, css: str, count: int, timeout: float = 90.0) -> list[str]:
        """The texts of the elements matching ``css`` once ``count`` of them show text."""
        deadline = time.monotonic() + timeout
        found: list[str] = []
        while time.monotonic() < deadline:
            found = self.texts(css)
            if sum(1 for t in found if t) >= count:
                return found
            time.sleep(1.0)
        raise AssertionError(f"fewer than {count} elements {css} with text; found {found}:\n{self.text()[:3000]}")

    def hrefs(self, label: str) -> list[str]:
        """Where each link whose own text is ``label`` leads, as the page wrote it."""
        script = ("[...document.querySelectorAll('a')].filter(a => a.innerText.trim() === "
                  f"{json.dumps(label)}).map(a => a.getAttribute('href'))")
        result = self.call("Runtime.evaluate", expression=script, returnByValue=True)
        return list(result.get("result", {}).get("value") or [])

    def click_text(self, label: str) -> None:
        """Click the first element whose own text is ``label`` (tabs, links)."""
        script = ("(() => { const all = [...document.querySelectorAll('a,button,[role=tab],span,div')];"
                  f" const hit = all.find(e => e.innerText && e.innerText.trim() === {json.dumps(label)});"
                  " if (hit) { hit.click(); return true; } return false; })()")
        self.call("Runtime.evaluate", expression=script)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
