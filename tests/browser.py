"""Debian's headless Chromium through chromium-driver, as the browser and security suites drive it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# --no-sandbox: tests run as root; the rest keep Chromium from calling home or updating mid-test.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--window-size=1280,900")  # fmt: skip


@contextmanager
def headless_chromium(profile: Path, *, record_logs: bool = False) -> Iterator[Any]:
    """Yield a selenium driver on a fresh ``profile`` folder; quit it at the end.

    ``record_logs``: keep every network request and console message (performance and browser
    logs), which the attacks read to prove that nothing left the page.
    """
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(f"{path} is missing: `make browser-deps` installs Debian's chromium and chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    if record_logs:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
