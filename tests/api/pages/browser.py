"""A headless Chromium for dashboard tests: one per test module, at desktop or phone width.

    from browser import Browser, needs_browser, web  # noqa: F401 (the fixture)

    pytestmark = needs_browser

    def test_page(web, some_daemon):
        web.base = some_daemon.url
        driver = web.driver(PHONE)
        web.open("/agents")

`driver(width)` sizes the window (DESKTOP 1280x900, PHONE 390x844) and returns the
selenium driver; `open(path)` loads a page of `base` and returns it too. Needs the Debian
packages `chromium` and `chromium-driver`; without them the tests are skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Iterator

import pytest

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
AVAILABLE = bool(CHROMIUM and os.path.exists(CHROMEDRIVER))
DESKTOP, PHONE = 1280, 390
HEIGHTS = {DESKTOP: 900, PHONE: 844}

needs_browser = pytest.mark.skipif(
    not AVAILABLE, reason="headless browser tests need Chromium and chromedriver: apt-get install chromium chromium-driver")


class Browser:
    """One Chromium; `base` is the daemon URL that `open` paths are relative to."""

    def __init__(self, chrome: Any) -> None:
        self.chrome = chrome
        self.base = ""

    def driver(self, width: int = DESKTOP) -> Any:
        size = self.chrome.get_window_size()
        height = HEIGHTS.get(width, 900)
        if (size["width"], size["height"]) != (width, height):
            self.chrome.set_window_size(width, height)
        return self.chrome

    def open(self, path: str) -> Any:
        self.chrome.get(self.base + path)
        return self.chrome

    def wait(self, until: Callable[[Any], Any], seconds: float = 15) -> Any:
        """Poll `until(driver)` every 50 ms until it is truthy; its value."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.chrome, seconds, poll_frequency=0.05,
                             ignored_exceptions=(WebDriverException,)).until(until)

    def click_and_wait(self, button: Any) -> None:
        """Click `button` (scrolled into view) and wait until the next page has loaded."""
        from selenium.webdriver.common.by import By

        self.chrome.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        old = self.chrome.find_element(By.TAG_NAME, "html")
        button.click()
        self.wait(lambda d: old.id != d.find_element(By.TAG_NAME, "html").id
                  and d.execute_script("return document.readyState") == "complete")

    def note(self) -> list[str]:
        """The paragraphs of the page's note (what the last form did)."""
        from selenium.webdriver.common.by import By

        return [p.text for p in self.chrome.find_elements(By.CSS_SELECTOR, "#page-note p")]

    def page_width(self) -> int:
        return self.chrome.execute_script("return document.documentElement.scrollWidth")


@pytest.fixture(scope="module")
def web() -> Iterator[Browser]:
    if not AVAILABLE:
        pytest.skip("headless browser tests need Chromium and chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={DESKTOP},{HEIGHTS[DESKTOP]}"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    chrome = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    chrome.set_page_load_timeout(30)
    yield Browser(chrome)
    chrome.quit()
