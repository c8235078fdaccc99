"""One headless Chromium per agent, driven through selenium and the system chromedriver.

selenium is imported when an agent first uses a browser (an idle daemon never loads it).
The distribution's chromium and chromedriver are used as they are: no browser download at
run time (Selenium Manager is never asked), and the browser is patched with the system.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import threading
import time
from typing import Any, Callable

from agentd.config import ToolsConfig

log = logging.getLogger("agentd.tools.browser")
SWEEP_SECS = 5.0
QUIT_WAIT = 5.0  # seconds a browser has to quit before its processes are killed


def browser_unavailable(config: ToolsConfig) -> str | None:
    """Why no browser can start here, or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install 'agentd[browser]')"
    if not os.access(config.chromium_path, os.X_OK):
        return f"chromium not found at {config.chromium_path}"
    if not os.access(config.chromedriver_path, os.X_OK):
        return f"chromedriver not found at {config.chromedriver_path}"
    return None


class Browser:
    """An agent's browser and the proxy all its connections go through; `lock` serialises
    the agent's calls on it."""

    def __init__(self, driver: Any, proxy: Any) -> None:
        self.driver = driver
        self.proxy = proxy
        self.lock = threading.Lock()
        self.used = time.monotonic()
        self.closed = False

    def end(self, wait: float) -> None:
        """Quit the browser, giving it `wait` seconds, then kill whatever is left of it: a page
        busy in a script that never ends holds chromedriver, and quit() with it."""
        self.closed = True
        quitter = threading.Thread(target=self._quit, daemon=True, name="browser-quit")
        quitter.start()
        quitter.join(wait)
        chromedriver = self.driver.service.process
        # chromedriver leads a process group of its own, which every Chromium process joins.
        # Once it is reaped its pid may be another's: only a chromedriver not yet reaped is killed.
        if chromedriver.poll() is None:
            try:
                os.killpg(chromedriver.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            chromedriver.wait(QUIT_WAIT)
        except Exception:  # noqa: BLE001 - SIGKILLed: it is reaped by the quit thread or the next wait
            log.debug("chromedriver not reaped", exc_info=True)
        self.proxy.close()

    def _quit(self) -> None:
        try:
            self.driver.quit()
        except Exception:  # noqa: BLE001 - a dead or killed browser is closed already
            log.debug("browser quit failed", exc_info=True)


class BrowserSessions:
    """Starts a browser on an agent's first browser call; closes it when idle, on agent kill
    and when the daemon stops."""

    def __init__(self, config: ToolsConfig) -> None:
        self.config = config
        self._browsers: dict[str, Browser] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()

    def get(self, agent_id: str, check: Callable[[str], None]) -> Browser:
        """The agent's browser, started on first use; `check(url)` raises ToolError for a
        place it may not connect to (the agent's rules as they are now)."""
        with self._lock:
            if self._closed:
                from agentd.agents.tools.base import ToolError

                raise ToolError("the daemon is stopping")
            browser = self._browsers.get(agent_id)
            if browser is None:
                browser = self._browsers[agent_id] = self._start(check)
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep, daemon=True, name="browser-idle")
                    self._sweeper.start()
            browser.proxy.check = check
            browser.used = time.monotonic()
            return browser

    def has(self, agent_id: str) -> bool:
        with self._lock:
            return agent_id in self._browsers

    def _start(self, check: Callable[[str], None]) -> Browser:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        from agentd.agents.tools.browser_proxy import BrowserProxy

        proxy = BrowserProxy(check, self.config.fetch_allow_hosts)
        options = webdriver.ChromeOptions()
        options.binary_location = self.config.chromium_path
        # `<-loopback>`: Chromium would otherwise reach localhost directly, past the proxy.
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--window-size=1280,900", "--disable-extensions", "--no-first-run",
                    f"--proxy-server=http://{proxy.address}", "--proxy-bypass-list=<-loopback>"):
            options.add_argument(arg)
        # WebRTC's UDP (STUN) would go past the proxy too.
        options.add_experimental_option("prefs", {"webrtc.ip_handling_policy": "disable_non_proxied_udp",
                                                  "webrtc.multiple_routes_enabled": False,
                                                  "webrtc.nonproxied_udp_enabled": False})
        try:
            service = Service(executable_path=self.config.chromedriver_path, popen_kw={"start_new_session": True})
            driver = webdriver.Chrome(service=service, options=options)
        except BaseException:
            proxy.close()
            raise
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        return Browser(driver, proxy)

    def close(self, agent_id: str, wait: float = QUIT_WAIT) -> bool:
        """Close the agent's browser, killing it when it does not quit within `wait` seconds."""
        with self._lock:
            browser = self._browsers.pop(agent_id, None)
        if browser is None:
            return False
        browser.end(wait)
        return True

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            agents = list(self._browsers)
        self._stop.set()
        closers = [threading.Thread(target=self.close, args=(a,), daemon=True) for a in agents]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(2 * QUIT_WAIT + 1)

    def _sweep(self) -> None:
        while not self._stop.wait(min(SWEEP_SECS, self.config.browser_idle_secs)):
            now = time.monotonic()
            with self._lock:
                idle = [a for a, b in self._browsers.items()
                        if now - b.used > self.config.browser_idle_secs and not b.lock.locked()]
            for agent_id in idle:
                log.info("closing the idle browser of agent %s", agent_id)
                self.close(agent_id)
