"""Debian's chromium under Selenium, headless, with a fresh profile: what the page's browser tests drive."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WIDE, NARROW = (1400, 1000), (420, 1000)


def require_browser() -> None:
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip(
            "chromium and chromium-driver are missing: scripts/install-system-deps.sh test installs them"
        )


@contextmanager
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    require_browser()
    profile = tempfile.mkdtemp(prefix="po-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDE[0]},{WIDE[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(check: Callable[[], bool], *, what: str, driver: Any, timeout: float = 60) -> None:
    """Reload the page until `check()` holds, as a person waiting for the auto-refresh would."""
    deadline = time.monotonic() + timeout
    while not _holds(check):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the page never showed {what}; it shows:\n{driver.find_element('tag name', 'main').text}"
            )
        time.sleep(0.5)
        driver.refresh()


def _holds(check: Callable[[], bool]) -> bool:
    """`check()`, False when the page was replaced under it (its own auto-refresh) or is not there yet (a
    navigation, such as the log in's redirect, still loading on a busy machine: CI's cold run of 624214e
    found no `main` right after the click): look again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return check()
    except (StaleElementReferenceException, NoSuchElementException):
        return False


def screenshots(driver: Any, folder: Path, name: str) -> None:
    for label, (width, height) in (("wide", WIDE), ("narrow", NARROW)):
        driver.set_window_size(width, height)
        driver.save_screenshot(str(folder / f"{name}-{label}.png"))
    driver.set_window_size(*WIDE)


def serious_violations(driver: Any) -> list[str]:
    """axe-core (bundled by axe-selenium-python) on the current page: its serious and critical findings."""
    from axe_selenium_python import Axe

    axe = Axe(driver)
    axe.inject()
    results = axe.run()
    assert results["passes"], "axe-core checked nothing: was it injected?"
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in results["violations"]
        if v.get("impact") in ("serious", "critical")
    ]
