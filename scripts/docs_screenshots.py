"""Render every page of the built documentation site in headless Chromium and keep a screenshot of each.

    python scripts/docs_screenshots.py [--site site] [--out site_screenshots] [--width 1280] [--height 1600]

Serves ``--site`` (the output of ``bash scripts/build_docs.sh``) on 127.0.0.1 with Python's http.server in a
background thread, then for every page (each ``*.html`` but ``404.html``):

1. fetches it over HTTP: the status must be 200 and the body not empty;
2. asks Chromium for the DOM after its scripts ran (``--dump-dom``): the ``<body>`` must hold text;
3. asks Chromium for a screenshot (``--screenshot``): the PNG must be written and not empty.

A page whose served or rendered HTML contains a Python traceback ("Traceback (most recent call last)", e.g. a
notebook cell that raised or an example that failed) fails as well. The screenshots go to ``--out`` (one PNG per
page, named after its path). Exit status 0 when every page passed, 1 when some failed (each failure is listed), 2
when Chromium is missing or the site has no pages.

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``); the script looks for ``chromium`` or
``chromium-browser`` on PATH, or takes ``--chromium PATH``.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

TRACEBACK = "Traceback (most recent call last)"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the name http.server uses
        pass


def find_chromium(explicit: str | None) -> str | None:
    if explicit:
        return explicit if shutil.which(explicit) or Path(explicit).is_file() else None
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def pages(site: Path) -> list[str]:
    """Site-relative URL paths of the pages: ``dir/`` for ``dir/index.html``, the file path otherwise."""
    out = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site).as_posix()
        if rel == "404.html":
            continue
        out.append(rel[: -len("index.html")] if rel.endswith("index.html") else rel)
    return out


def png_name(page: str) -> str:
    stem = page.strip("/").removesuffix(".html").replace("/", "_")
    return f"{stem or 'index'}.png"


def body_text(dom: str) -> str:
    match = re.search(r"<body[^>]*>(.*)</body>", dom, flags=re.S | re.I)
    inner = match.group(1) if match else ""
    inner = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", inner, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", " ", inner)).strip()


class Chromium:
    def __init__(self, binary: str, width: int, height: int, timeout: float):
        self.binary, self.width, self.height, self.timeout = binary, width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="docs-screenshots-chromium-")

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [self.binary, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={self.profile}",
               f"--window-size={self.width},{self.height}",
               # let the page's scripts run (search index, code copy buttons) before the DOM or pixels are taken
               "--virtual-time-budget=5000", *args]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        return subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)

    def dump_dom(self, url: str) -> str:
        result = self._run("--dump-dom", url)
        if result.returncode != 0:
            raise RuntimeError(f"chromium --dump-dom exited with {result.returncode}: {result.stderr[-500:]}")
        return result.stdout

    def screenshot(self, url: str, dest: Path) -> None:
        dest.unlink(missing_ok=True)
        result = self._run(f"--screenshot={dest}", url)
        if result.returncode != 0 or not dest.is_file() or dest.stat().st_size == 0:
            raise RuntimeError(f"chromium --screenshot exited with {result.returncode}, no image written: "
                               f"{result.stderr[-500:]}")

    def close(self) -> None:
        shutil.rmtree(self.profile, ignore_errors=True)


def check_page(base: str, page: str, browser: Chromium, out: Path) -> list[str]:
    """The problems of one page (empty when it rendered)."""
    url = base + page
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            status, served = response.status, response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as err:
        return [f"HTTP {err.code}"]
    except OSError as err:
        return [f"cannot fetch: {err}"]
    problems = []
    if status != 200:
        problems.append(f"HTTP {status}")
    if not served.strip():
        problems.append("empty response")
    if TRACEBACK in served:
        problems.append("the served HTML contains a Python traceback")
    try:
        dom = browser.dump_dom(url)
        if not body_text(dom):
            problems.append("the rendered <body> is empty")
        if TRACEBACK in dom and TRACEBACK not in served:
            problems.append("the rendered page contains a Python traceback")
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        problems.append(f"does not render: {err}")
    try:
        browser.screenshot(url, out / png_name(page))
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        problems.append(f"screenshot failed: {err}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"), help="built site (default: site)")
    parser.add_argument("--out", type=Path, default=Path("site_screenshots"),
                        help="where the PNGs go (default: site_screenshots)")
    parser.add_argument("--width", type=int, default=1280, help="window width in pixels (default: 1280)")
    parser.add_argument("--height", type=int, default=1600, help="window height in pixels (default: 1600)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per Chromium call (default: 90)")
    parser.add_argument("--chromium", default=None, help="Chromium binary (default: chromium or chromium-browser "
                                                         "on PATH)")
    args = parser.parse_args(argv)

    binary = find_chromium(args.chromium)
    if binary is None:
        print("docs_screenshots: Chromium not found: install Debian's package (apt-get install -y chromium) or pass "
              "--chromium PATH; looked for 'chromium' and 'chromium-browser' on PATH", file=sys.stderr)
        return 2
    site = args.site.resolve()
    todo = pages(site) if site.is_dir() else []
    if not todo:
        print(f"docs_screenshots: no pages under {site}; build the site first (bash scripts/build_docs.sh)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=site))
    thread = threading.Thread(target=server.serve_forever, name="docs-server", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Chromium(binary, args.width, args.height, args.timeout)
    failures: dict[str, list[str]] = {}
    try:
        for page in todo:
            problems = check_page(base, page, browser, args.out)
            print(f"{'FAIL' if problems else 'ok  '} /{page} -> {args.out / png_name(page)}"
                  + "".join(f"\n       {p}" for p in problems), flush=True)
            if problems:
                failures[page] = problems
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    print(f"docs_screenshots: {len(todo) - len(failures)} of {len(todo)} pages rendered; screenshots in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
