"""browser_*: a real (headless Chromium) browser per agent, for pages that need JavaScript.

The session lives in agentd/agents/tools/browser_sessions.py. Every connection the browser
makes (pages, redirects, images, scripts' requests) goes through the agent's proxy, which
applies web_fetch's SSRF check to it (agentd/agents/tools/browser_proxy.py); the page the
browser ends up on is checked too, and left for about:blank when it fails.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.agents.tools.browser_sessions import Browser, browser_unavailable
from agentd.agents.tools.web import check_url

WAIT_DEFAULT_MS = 5000
WAIT_MAX_MS = 30000
SCROLL_DEFAULT = 600
# Above the 30 s a page load, a script's callback and browser_wait may take.
CALL_LIMIT = 40.0
# Clickable things whose visible text a model names instead of a CSS selector.
_BY_TEXT = """
const wanted = arguments[0].trim();
const els = [...document.querySelectorAll(
  'a, button, input[type=submit], input[type=button], [role=button], [onclick], label, summary, option')];
const text = e => (e.innerText || e.value || '').trim();
return els.find(e => text(e) === wanted) || els.find(e => text(e).includes(wanted)) || null;
"""


def _browser(ctx: ToolContext) -> Browser:
    return ctx.require_services().browsers.get(ctx.agent_id, lambda url: check_url(ctx, url))


def _cap(ctx: ToolContext, text: str) -> str:
    limit = ctx.tools_config.browser_max_text_bytes
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f"\n[page text truncated at {limit} bytes of {len(data)}]"


def _guard(ctx: ToolContext, driver: Any) -> None:
    """The page the browser is on must be one web_fetch could fetch."""
    url = driver.current_url or ""
    if url.startswith(("http://", "https://")):
        try:
            check_url(ctx, url)
        except ToolError:
            driver.get("about:blank")
            raise


def _page(ctx: ToolContext, driver: Any) -> str:
    """The page as the model reads it: title, URL and the rendered text."""
    from selenium.webdriver.common.by import By

    _guard(ctx, driver)
    try:
        text = driver.find_element(By.TAG_NAME, "body").text
    except Exception:  # noqa: BLE001 - a page without a body (about:blank, an image) has no text
        text = ""
    return _cap(ctx, f"title: {driver.title}\nurl: {driver.current_url}\n\n{text}")


def _find(driver: Any, selector: str) -> Any:
    from selenium.common.exceptions import InvalidSelectorException, WebDriverException
    from selenium.webdriver.common.by import By

    try:
        found = driver.find_elements(By.CSS_SELECTOR, selector)
    except InvalidSelectorException:
        found = []
    except WebDriverException:
        found = []
    if found:
        return found[0]
    element = driver.execute_script(_BY_TEXT, selector)
    if element is None:
        raise ToolError(f"no element matches {selector!r} (as a CSS selector or as visible text)")
    return element


def _act(ctx: ToolContext, action: Any) -> str:
    """Run `action(driver)` on the agent's browser and describe the page afterwards."""
    from selenium.common.exceptions import InvalidSessionIdException, NoSuchWindowException, WebDriverException

    while True:
        try:
            browser = _browser(ctx)
        except WebDriverException as exc:
            raise ToolError(f"the browser did not start: {_first_line(exc)}") from None
        with browser.lock:
            if browser.closed:  # while this call waited for the one before it
                continue
            try:
                return _within(ctx, browser, action)
            except (InvalidSessionIdException, NoSuchWindowException) as exc:
                # The browser died or its window is gone: the next call starts a new one.
                ctx.require_services().browsers.close(ctx.agent_id)
                raise ToolError(f"the browser was lost ({_first_line(exc)}); call again to start a new one") from None
            except WebDriverException as exc:
                raise ToolError(f"browser: {_first_line(exc)}") from None
            except ToolError:
                raise
            except Exception:
                if browser.closed:  # by browser_close, the agent's kill or the daemon's stop
                    raise ToolError("the browser was closed during this call; call again to start a new one") from None
                raise
            finally:
                browser.used = time.monotonic()


def _within(ctx: ToolContext, browser: Browser, action: Any) -> str:
    """`action`'s answer, or the page after it, within CALL_LIMIT seconds. A page's script that
    never ends holds chromedriver and every call after it: the browser is killed instead."""
    answer: Future[str] = Future()

    def work() -> None:
        try:
            result = action(browser.driver)
            answer.set_result(result if isinstance(result, str) else _page(ctx, browser.driver))
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            answer.set_exception(exc)

    threading.Thread(target=work, daemon=True, name="browser-call").start()
    try:
        return answer.result(CALL_LIMIT)
    except TimeoutError:
        if answer.done():  # the action's own
            raise
        ctx.require_services().browsers.close(ctx.agent_id, wait=0)
        raise ToolError(f"the browser did not answer within {CALL_LIMIT:g} s (a script that never ends?): it "
                        "was closed, and the next browser call starts a new one") from None


def _first_line(exc: Exception) -> str:
    return (getattr(exc, "msg", None) or type(exc).__name__).splitlines()[0]


_FAMILY = {"family": "browser", "capability": "network", "check": browser_unavailable}


@tool("browser_navigate", "Navigate a browser to a URL. Returns the page title and readable content as "
      "markdown. Opens a persistent browser session.",
      {"url": {"type": "string", "description": "The URL to navigate to (http/https only)"}}, ("url",),
      read_only=True, **_FAMILY)
def browser_navigate(ctx: ToolContext, args: dict[str, Any]) -> str:
    check_url(ctx, args["url"])
    ctx.audit("tool.browser_navigate", {"url": args["url"][:500]})
    return _act(ctx, lambda driver: driver.get(args["url"]))


@tool("browser_click", "Click an element on the current browser page by CSS selector or visible text. Returns "
      "the resulting page state.",
      {"selector": {"type": "string",
                    "description": "CSS selector (e.g., '#submit-btn', '.add-to-cart') or visible text to click"}},
      ("selector",), **_FAMILY)
def browser_click(ctx: ToolContext, args: dict[str, Any]) -> str:
    ctx.audit("tool.browser_click", {"selector": args["selector"][:200]})
    return _act(ctx, lambda driver: _find(driver, args["selector"]).click())


@tool("browser_type", "Type text into an input field on the current browser page.",
      {"selector": {"type": "string",
                    "description": "CSS selector for the input field (e.g., 'input[name=\"email\"]', '#search-box')"},
       "text": {"type": "string", "description": "The text to type into the field"}},
      ("selector", "text"), **_FAMILY)
def browser_type(ctx: ToolContext, args: dict[str, Any]) -> str:
    def type_into(driver: Any) -> str:
        element = _find(driver, args["selector"])
        element.clear()
        element.send_keys(args["text"])
        return f"typed {len(args['text'])} characters into {args['selector']}"

    ctx.audit("tool.browser_type", {"selector": args["selector"][:200]})
    return _act(ctx, type_into)


@tool("browser_screenshot", "Take a screenshot of the current browser page. It is stored as a PNG file of the "
      "agent; returns its file_id.",
      {}, read_only=True, **_FAMILY)
def browser_screenshot(ctx: ToolContext, args: dict[str, Any]) -> str:
    services = ctx.require_services()

    def shoot(driver: Any) -> str:
        _guard(ctx, driver)
        png = driver.get_screenshot_as_png()
        saved = services.save_upload(ctx.agent_id, f"screenshot-{time.strftime('%Y%m%d-%H%M%S')}.png",
                                     "image/png", png)
        ctx.audit("tool.browser_screenshot", {"file_id": saved["file_id"], "bytes": len(png)})
        # The image itself would flood the model's context; the upload is one attachment away.
        return json.dumps({**saved, "url": driver.current_url})

    return _act(ctx, shoot)


@tool("browser_read_page", "Read the current browser page content as structured markdown. Use after clicking or "
      "navigating to see the updated page.", {}, read_only=True, **_FAMILY)
def browser_read_page(ctx: ToolContext, args: dict[str, Any]) -> str:
    return _act(ctx, lambda driver: None)


@tool("browser_close", "Close the browser session. The browser will also auto-close when the agent loop ends.",
      {}, read_only=True, **_FAMILY)
def browser_close(ctx: ToolContext, args: dict[str, Any]) -> str:
    closed = ctx.require_services().browsers.close(ctx.agent_id)
    if closed:
        ctx.audit("tool.browser_close", {})
    return "browser closed" if closed else "no browser was open"


@tool("browser_scroll", "Scroll the browser page. Use this to see content below the fold or navigate long pages.",
      {"direction": {"type": "string", "description": "Scroll direction: 'up', 'down', 'left', 'right' "
                                                      "(default: 'down')"},
       "amount": {"type": "integer", "description": "Pixels to scroll (default: 600)"}},
      read_only=True, **_FAMILY)
def browser_scroll(ctx: ToolContext, args: dict[str, Any]) -> str:
    direction = args.get("direction") or "down"
    amount = args.get("amount", SCROLL_DEFAULT)
    if amount < 1:
        raise ToolError(f"amount is a number of pixels, at least 1 (the direction says which way), not {amount}")
    moves = {"down": (0, amount), "up": (0, -amount), "right": (amount, 0), "left": (-amount, 0)}
    if direction not in moves:
        raise ToolError(f"direction must be one of up, down, left, right, not {direction!r}")
    dx, dy = moves[direction]

    def scroll(driver: Any) -> str:
        x, y = driver.execute_script(f"window.scrollBy({dx}, {dy}); return [window.scrollX, window.scrollY];")
        return f"scrolled {direction} by {amount}px; now at x={x}, y={y}"

    return _act(ctx, scroll)


@tool("browser_wait", "Wait for a CSS selector to appear on the page. Useful for dynamic content that loads "
      "asynchronously.",
      {"selector": {"type": "string", "description": "CSS selector to wait for"},
       "timeout_ms": {"type": "integer", "description": "Max wait time in milliseconds (default: 5000, max: 30000)"}},
      ("selector",), read_only=True, **_FAMILY)
def browser_wait(ctx: ToolContext, args: dict[str, Any]) -> str:
    timeout_ms = min(args.get("timeout_ms", WAIT_DEFAULT_MS), WAIT_MAX_MS)
    if timeout_ms < 1:
        raise ToolError(f"timeout_ms is a number of milliseconds, at least 1, not {timeout_ms}")

    def wait(driver: Any) -> str:
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            WebDriverWait(driver, timeout_ms / 1000, poll_frequency=0.1).until(
                expected_conditions.presence_of_element_located((By.CSS_SELECTOR, args["selector"])))
        except TimeoutException:
            raise ToolError(f"{args['selector']!r} did not appear within {timeout_ms} ms") from None
        return f"{args['selector']} is present"

    return _act(ctx, wait)


@tool("browser_back", "Go back to the previous page in browser history.", {}, read_only=True, **_FAMILY)
def browser_back(ctx: ToolContext, args: dict[str, Any]) -> str:
    ctx.audit("tool.browser_back", {})
    return _act(ctx, lambda driver: driver.back())


@tool("browser_run_js", "Run JavaScript on the current browser page and return the result. For advanced "
      "interactions that other browser tools cannot handle.",
      {"expression": {"type": "string", "description": "JavaScript expression to run in the page context"}},
      ("expression",), **_FAMILY)
def browser_run_js(ctx: ToolContext, args: dict[str, Any]) -> str:
    def run(driver: Any) -> str:
        value = driver.execute_script("return eval(arguments[0]);", args["expression"])
        _guard(ctx, driver)
        return _cap(ctx, json.dumps(value, ensure_ascii=False, default=str))

    ctx.audit("tool.browser_run_js", {"bytes": len(args["expression"])})
    return _act(ctx, run)
