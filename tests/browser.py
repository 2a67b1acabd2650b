"""Headless Chromium driven over the DevTools protocol (websocket-client), for tests/test_book.py.

    with Browser(chromium()) as browser:
        report = browser.load("file:///.../index.html")   # the page's console errors, images, maths, links
        browser.screenshot("page.png")

One tab; every console error, uncaught exception and failed load (``Log.entryAdded`` at level error,
e.g. a missing file) is kept with the page it happened on. Run as root, Chromium needs --no-sandbox.
"""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

# Run in each loaded page: what a reader would see broken. An equation is MathML (tutorials/book/hooks.py):
# drawn as math when its display is 'math' or 'block math' and a fraction's numerator sits above its
# denominator; TeX left in the text outside code, or an arithmatex wrapper left over, is an equation not drawn.
INSPECT = r"""(() => {
  const article = document.querySelector("article") || document.body;
  const prose = article.cloneNode(true);
  prose.querySelectorAll("pre, code").forEach(node => node.remove());
  const fractions = [...article.querySelectorAll("mfrac")].map(f =>
      f.children.length === 2
        ? f.children[0].getBoundingClientRect().bottom <= f.children[1].getBoundingClientRect().top + 1 : false);
  return {
    title: document.title,
    images: document.images.length,
    broken_images: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))
                                       .map(i => i.getAttribute("src")),
    maths: [...article.querySelectorAll("math")].map(m => getComputedStyle(m).display),
    fractions: fractions,
    tex_left: [...prose.innerText.matchAll(/\$\$|\\\(|\\\[|\\frac|\\left/g)].map(m => m[0]),
    wrappers_left: article.querySelectorAll(".arithmatex").length,
    highlighted: article.querySelectorAll(".highlight span.k, .highlight span.kn").length,
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    ids: [...document.querySelectorAll("[id]")].map(e => e.id),
  };
})()"""


def chromium():
    """The path of a Chromium (Debian's ``chromium``) on PATH, or None."""
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    def __init__(self, executable, width=1280, height=1000, timeout=30):
        import websocket  # the test extra's websocket-client; chromium() needs none
        self.profile = Path(tempfile.mkdtemp(prefix="minidl-chromium-"))
        command = [executable, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                   "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
                   "--remote-debugging-port=0",
                   "--remote-allow-origins=*", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                   "about:blank"]
        if os.geteuid() == 0:
            command.insert(1, "--no-sandbox")       # Chromium refuses to run as root with its sandbox
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.timeout, self.next_id, self.events = timeout, 0, []
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{executable} did not start its DevTools endpoint within {timeout} s")
            time.sleep(0.05)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as answer:
            page = next(target for target in json.load(answer) if target["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method, **params):
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            self.events.append(message)
            if message.get("method") == event:
                return message
        raise TimeoutError(f"no {event} within {self.timeout} s")

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self):
        """Console errors, uncaught exceptions and failed loads since the last call, as strings."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console: " + " ".join(str(arg.get("value", arg.get("description")))
                                                    for arg in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append("exception: " + details.get("exception", {}).get("description", details.get("text", "")))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}".strip())
        self.events = []
        return found

    def load(self, url):
        """Open ``url``, wait for its load event and a moment for its scripts; returns INSPECT's report + errors."""
        self.errors()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        report = self.evaluate(INSPECT)
        self.evaluate("new Promise(done => setTimeout(done, 50))")     # scripts run on load: let their errors in
        report["errors"] = self.errors()
        return report

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self):
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
