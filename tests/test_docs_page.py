"""`/docs` in a real browser (headless Chromium, driven as in test_playground.py): the bundled Swagger UI reads
the server's OpenAPI 3.1 document and lists its operations, under a Content-Security-Policy as strict as the
playground's, with nothing refused by it and nothing fetched from another host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from test_playground import WAIT_S, browser, free_port, screens, serve

from agentdb.config import Settings

__all__ = ["browser", "screens"]  # fixtures shared with test_playground.py


@pytest.fixture
def site(db_url: str) -> Iterator[str]:
    with serve(Settings(database_url=db_url, port=free_port())) as url:
        yield url


def test_docs_lists_the_retrieval_operation(browser: WebDriver, site: str, screens: Path) -> None:
    response = httpx.get(f"{site}/docs")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert (
        "script-src 'self';" in policy and "default-src 'none'" in policy and "connect-src 'self'" in policy
    )
    assert httpx.get(f"{site}/openapi.json").json()["openapi"].startswith("3.1")

    browser.get_log("browser")  # drop what earlier tests logged
    browser.get(f"{site}/docs")
    operation = '.opblock-post .opblock-summary-path[data-path="/agents/retrieval"]'
    WebDriverWait(browser, WAIT_S).until(
        lambda driver: driver.find_elements(By.CSS_SELECTOR, operation), message="POST /agents/retrieval"
    )
    browser.save_screenshot(str(screens / "docs.png"))
    assert not browser.find_elements(By.CSS_SELECTOR, ".errors-wrapper"), "Swagger UI reported errors"
    refused = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
    assert not refused, refused
    requested = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert requested and all(name.startswith(site) for name in requested), requested
