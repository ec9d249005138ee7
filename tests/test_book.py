"""The book and JupyterLab, tested in a real browser (headless Chromium driven by Playwright).

The book is built from the notebooks' smoke runs (the session's `smoke_run` fixture) and served
over HTTP on 127.0.0.1: every page must load with no console error, every image must decode, every
maths element must be typeset by the book's own MathJax (no network), and every internal link must
resolve. JupyterLab is started the way `make lab` starts it, notebook 01 is opened and run with its
default parameters (results mode "auto": every step is read from the committed results), and every
figure must appear with no cell in error. Screenshots go to the test's temporary folder.

Skipped, with what to install, where there is no browser: `apt-get install chromium` and
`pip install -e ".[book]"` (the `.ci/run` script does both).
"""

import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from conftest import needs_shipped

from speclib.core.device import REPO

CHROMIUM = os.environ.get("SPECLIB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    import playwright.sync_api  # noqa: F401

    HAVE_PLAYWRIGHT = True
except ImportError:
    HAVE_PLAYWRIGHT = False
needs_browser = pytest.mark.skipif(
    not (CHROMIUM and HAVE_PLAYWRIGHT),
    reason="no headless browser: `apt-get install chromium` and `pip install -e '.[book]'` (playwright) to run it",
)
NOTEBOOKS = [
    "01_baseline",
    "02_cache_hybrid",
    "03_tree_hybrid",
    "04_cospec_rl",
    "05_backend_latency",
    "06_self_speculation",
    "07_spec_bench",
    "08_serving",
]
PAGE_TIMEOUT_MS = 60_000
LAB_RUN_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def serve(folder: Path):
    """A static file server for `folder` on 127.0.0.1 (a daemon thread); returns (server, base URL)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def check_links(html_root: Path, page_path: Path, hrefs: list[str]) -> list[str]:
    """Internal links of a page whose file or #anchor does not exist."""
    bad = []
    for href in hrefs:
        parts = urllib.parse.urlsplit(href)
        if (
            parts.scheme in ("http", "https")
            and parts.hostname != "127.0.0.1"
            or parts.scheme in ("mailto", "data", "javascript")
        ):
            continue
        target = (
            page_path
            if not parts.path
            else (
                html_root / urllib.parse.unquote(parts.path.lstrip("/"))
                if parts.scheme
                else (page_path.parent / urllib.parse.unquote(parts.path))
            )
        )
        target = target.resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            bad.append(href)
        elif parts.fragment and target.suffix == ".html":
            text = target.read_text(errors="replace")
            if f'id="{parts.fragment}"' not in text and f"id='{parts.fragment}'" not in text:
                bad.append(href)
    return bad


@needs_shipped
@needs_browser
def test_book_pages_load_typeset_maths_decode_figures_and_link(smoke_run, browser, tmp_path):
    from speclib.workbook import book

    # from the last notebook back, skipping any another pytest-xdist worker is running now (its own smoke
    # test, usually taken in file order), then waiting for those: the two workers meet in the middle
    pending = [nb for nb in reversed(NOTEBOOKS) if smoke_run(nb, block=False) is None]
    executed = [smoke_run(nb) for nb in pending][-1] if pending else smoke_run(NOTEBOOKS[0])
    index = book.build(out=tmp_path / "book", executed=executed)
    html_root = index.parent
    pages = sorted(
        p
        for p in html_root.rglob("*.html")
        if not p.name.startswith(("genindex", "search")) and not p.relative_to(html_root).parts[0].startswith("_")
    )  # _static/: theme templates
    assert {f"notebooks/{nb}.html" for nb in NOTEBOOKS} <= {p.relative_to(html_root).as_posix() for p in pages}
    for p in pages:  # no script or stylesheet from the network: MathJax is the book's own
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', p.read_text())
        assert not [u for u in remote if not u.startswith("http://127.0.0.1")], f"{p.name} loads {remote}"
    server, base = serve(html_root)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        # the theme's own colour-mode script logs this when no mode was ever stored; it then uses "auto"
        theme_noise = "Got invalid theme mode"
        page.on(
            "console",
            lambda m: (
                errors.append(f"{page.url}: {m.text}") if m.type == "error" and theme_noise not in m.text else None
            ),
        )
        page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
        figures = 0
        for p in pages:
            rel = p.relative_to(html_root).as_posix()
            page.goto(base + rel, wait_until="load", timeout=PAGE_TIMEOUT_MS)
            has_math = page.evaluate("() => document.querySelectorAll('.math').length") > 0
            if has_math:
                page.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=PAGE_TIMEOUT_MS
                )
                page.evaluate("() => MathJax.startup.promise")
                raw = page.evaluate(
                    "() => [...document.querySelectorAll('.math')].filter(e => !e.querySelector('mjx-container')).length"
                )
                assert raw == 0, f"{rel}: {raw} maths elements not typeset"
            text = page.evaluate("() => document.querySelector('main, article, body').innerText")
            assert not re.search(r"\$\$|\\\(|\\\[", text), f"{rel}: raw LaTeX left in the page"
            imgs = page.evaluate(
                "() => [...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
            )
            bad = [src for src, complete, width in imgs if not (complete and width > 0)]
            assert not bad, f"{rel}: images that do not decode: {bad}"
            if rel.startswith("notebooks/"):
                figures += sum(1 for src, _, _ in imgs if src and not src.endswith(".svg"))
                assert len(imgs) > 0, f"{rel}: no figure"
            hrefs = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))")
            assert not check_links(html_root, p, hrefs), (
                f"{rel}: broken internal links {check_links(html_root, p, hrefs)}"
            )
            if rel in ("index.html", "notebooks/01_baseline.html"):
                page.screenshot(path=str(tmp_path / f"screenshot_{rel.replace('/', '_')}.png"), full_page=False)
        assert not errors, "console errors:\n" + "\n".join(errors)
        assert figures >= 15  # every notebook's figures, as images
    finally:
        server.shutdown()
    print(f"book: {len(pages)} pages, {figures} figures; screenshots in {tmp_path}")


def lab_command(port: int, token: str, settings: Path) -> list[str]:
    """JupyterLab as `make lab` starts it (plus a fixed port and token, no browser of its own)."""
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--notebook-dir={REPO}",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
        f"--LabApp.user_settings_dir={settings}",
    ]
    return cmd + (["--allow-root"] if os.geteuid() == 0 else [])


@needs_shipped
@needs_browser
def test_jupyterlab_runs_notebook_01_with_every_figure(browser, tmp_path):
    pytest.importorskip("jupyterlab")
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # render every cell, not only the visible ones, so that every figure is in the page
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = free_port(), "speclib-test"
    env = dict(os.environ, SPECLIB_OUT=str(tmp_path / "out"))  # the kernel writes there, not over data/
    lab = subprocess.Popen(
        lab_command(port, token, tmp_path / "settings"),
        env=env,
        cwd=REPO,
        stdout=open(tmp_path / "lab.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        url = f"http://127.0.0.1:{port}/lab/tree/notebooks/01_baseline.ipynb?token={token}"
        for _ in range(60):
            try:
                page.goto(url, timeout=PAGE_TIMEOUT_MS)
                break
            except Exception:
                time.sleep(1)
        page.wait_for_function(
            "() => window.jupyterapp && jupyterapp.shell.currentWidget "
            "&& jupyterapp.shell.currentWidget.sessionContext "
            "&& jupyterapp.shell.currentWidget.sessionContext.session "
            "&& jupyterapp.shell.currentWidget.sessionContext.session.kernel",
            timeout=120_000,
        )
        t0 = time.perf_counter()
        page.evaluate("() => jupyterapp.commands.execute('notebook:run-all-cells')")
        done = (
            "() => { const nb = jupyterapp.shell.currentWidget; const cells = nb.content.model.cells;"
            " let n = 0, done = 0; for (let i = 0; i < cells.length; i++) { const c = cells.get(i);"
            " if (c.type === 'code') { n++; if (c.executionCount) done++; } }"
            " return nb.sessionContext.session.kernel.status === 'idle' && done === n; }"
        )
        page.wait_for_function(done, timeout=LAB_RUN_TIMEOUT_S * 1000, polling=2000)
        seconds = time.perf_counter() - t0
        errors = page.evaluate(
            "() => { const cells = jupyterapp.shell.currentWidget.content.model.cells; const out = [];"
            " for (let i = 0; i < cells.length; i++) { const c = cells.get(i); if (c.type !== 'code') continue;"
            " for (let j = 0; j < c.outputs.length; j++) { const o = c.outputs.get(j);"
            " if (o.type === 'error') out.push(i + ': ' + JSON.stringify(o.toJSON()).slice(0, 300)); } }"
            " return out; }"
        )
        assert not errors, f"cells in error: {errors}"
        images = page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea-output img')].map(i => i.naturalWidth)"
        )
        assert len(images) >= 5 and all(w > 0 for w in images), images  # the five figures of notebook 01
        page.screenshot(path=str(tmp_path / "jupyterlab_01.png"))
        print(f"JupyterLab: notebook 01 ran all cells in {seconds:.0f} s with {len(images)} figures")
    finally:
        lab.terminate()
        try:
            lab.wait(20)
        except subprocess.TimeoutExpired:
            lab.kill()
