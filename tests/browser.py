"""Headless Chromium for the viewer's tests (Selenium with Debian's chromium and chromium-driver): `page(path)`
opens a file and waits until the page's script ran. Skips, naming the install command, where there is none."""

from __future__ import annotations

import os
import shutil
import time

import pytest

INSTALL = "apt-get install -y chromium chromium-driver && pip install selenium  (or: make test, which does both)"


def driver():
    """A headless Chrome driver, or a skip that says how to get one."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    chromedriver = shutil.which("chromedriver")
    if not (binary and chromedriver):
        pytest.skip(f"no headless Chromium here: {INSTALL}")
    pytest.importorskip("selenium", reason=f"selenium is not installed: {INSTALL}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
    ):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(chromedriver), options=opts)  # no driver download: Debian's


def open_page(d, path: str, timeout: float = 60.0) -> float:
    """Load a page from disk; seconds until its script has rendered (body[data-ready])."""
    t0 = time.perf_counter()
    d.get("file://" + os.path.abspath(path))
    while d.execute_script("return document.body && document.body.dataset.ready") != "1":
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{path}: the page did not render in {timeout:.0f} s")
        time.sleep(0.05)
    return time.perf_counter() - t0


def artifact(name: str) -> str:
    """Where a test saves a screenshot: $NANOSKY_ARTIFACTS (CI can keep it), else runs/test-artifacts."""
    out = os.environ.get("NANOSKY_ARTIFACTS") or os.path.join(os.path.dirname(__file__), "..", "runs", "test-artifacts")
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, name)
