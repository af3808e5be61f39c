"""The playground page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`)
driven by selenium against `agentdb`'s app served by uvicorn on 127.0.0.1, a real PostgreSQL and the real
embedder, over the runbook corpus of test_navigation plus a document made of HTML. What the page shows is
checked against what the JSON API answers for the same request. Screenshots of each state are written to
$AGENTDB_SCREENSHOTS, or to a pytest temporary directory, and the location is printed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from fake_anthropic import API_KEY, FakeAnthropicAPI, reply_text, reply_tool
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait
from test_navigation import DOCS, doc, load_runbooks

from agentdb.api import create_app
from agentdb.auth import create_principal
from agentdb.config import Settings
from agentdb.db.pool import configure


def fixed(value: float, digits: int) -> str:
    """`value` as the page shows it, JavaScript's Number.prototype.toFixed: the exact binary value rounded half
    up (0.03125, a document fourth in both legs of RRF, is 0.0313 there, where Python's format gives 0.0312)."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


SCRIPT_TITLE = '<img src="x" onerror="window.pwned = \'title\'">Restore <b>drill</b>'
SCRIPT_TEXT = "<script>window.pwned = 'text'</script> Restore drill: replay archived WAL on a spare host."
CORPUS = [*DOCS, doc("drill", SCRIPT_TITLE, SCRIPT_TEXT, "backup")]
WAIT_S = 60


def _chromium() -> tuple[str, str]:
    """The browser and its driver; a missing one fails the test (CI installs them in .ci/run)."""
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(
            "the playground tests need headless Chromium: apt-get install -y chromium chromium-driver "
            f"(chromium: {browser}, chromedriver: {driver})"
        )
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    binary, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def screens(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the screenshots go; printed (past pytest's output capture) when the module is done."""
    where = os.environ.get("AGENTDB_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("playground-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    yield path
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        shots = sorted(p.name for p in path.glob("*.png"))
        print(f"\nplayground screenshots ({len(shots)}): {path}")


@contextmanager
def serve(settings: Settings) -> Iterator[str]:
    """The app served by uvicorn in a thread on 127.0.0.1:`settings.port`; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=settings.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def site(db_url: str, embedder: Any, fake: tuple[FakeAnthropicAPI, str]) -> Iterator[str]:
    """A server over the runbooks (tree index `sections`, graph index `xref`), with no principals; its model
    is the fake Messages API (tests/fake_anthropic.py), for agentic walks."""
    settings = Settings(
        database_url=db_url, port=free_port(), anthropic_api_key=API_KEY, anthropic_base_url=fake[1]
    )
    with serve(settings) as url:
        with httpx.Client(base_url=url) as http:
            load_runbooks(http, CORPUS)
        yield url


class Page:
    """The playground in the browser, with the steps a user takes."""

    def __init__(self, driver: WebDriver, url: str, screens: Path) -> None:
        self.driver, self.url, self.screens = driver, url, screens
        driver.set_window_size(1400, 1000)
        driver.get_log("browser")  # drop what earlier tests logged
        driver.get(f"{url}/")

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, condition: Any, what: str) -> Any:
        # The page redraws lists as answers arrive: an element found a moment ago may be gone; look again.
        waiting = WebDriverWait(self.driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
        return waiting.until(lambda _: condition(), message=what)

    def shot(self, name: str, top: str | None = None) -> None:
        """A screenshot of the window, scrolled to put the element `top` at its top when given."""
        if top is not None:
            self.driver.execute_script("arguments[0].scrollIntoView()", self.find(top))
        self.driver.save_screenshot(str(self.screens / f"{name}.png"))

    def sources(self) -> list[str]:
        return [o.get_attribute("value") or "" for o in Select(self.find("#source")).options]

    def choose_index(self, name: str) -> None:
        """Pick index `name` for navigation once the source's indexes have arrived (they load after it)."""

        def offered() -> bool:
            return name in [o.get_attribute("value") for o in Select(self.find("#nav-index")).options]

        self.wait(offered, f"index {name!r} in the navigation panel")
        Select(self.find("#nav-index")).select_by_value(name)

    def fill(self, css: str, text: str) -> None:
        field = self.find(css)
        field.clear()
        field.send_keys(text)

    def search(self, text: str, mode: str = "hybrid", source: str = "runbooks", **fields: str) -> None:
        """Ask `text` in `mode` with other fields of the form set (by element id), and wait for the answer."""
        self.wait(lambda: source in self.sources(), "the source list")
        self.fill("#query", text)
        self.find(f'input[name="mode"][value="{mode}"]').click()
        for name, value in fields.items():
            self.fill(f"#{name}", value)
        self.find("#search").click()
        self.wait(lambda: self.find("#results").get_attribute("aria-busy") == "false", "the search to end")

    def hits(self) -> list[dict[str, str]]:
        rows = []
        for row in self.all("#hits tbody tr"):
            cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
            keys = ("rank", "id", "title", "score", "dense", "lexical", "snippet", "chunk")
            rows.append(dict(zip(keys, cells, strict=True)))
        return rows


@pytest.fixture
def page(browser: WebDriver, site: str, screens: Path) -> Page:
    return Page(browser, site, screens)


def api_request(text: str, mode: str, **spec: Any) -> dict[str, Any]:
    """The JSON request the page sends for `text` in `mode` with its default form values."""
    query: dict[str, Any] = {"table": "runbooks", "limit": 10, "threshold": 0.7, "rrf_k": 60, "fusion": "rrf"}
    if mode != "lexical":
        query["semantic_search"] = text
    if mode != "dense":
        query["full_text_search"] = text
    return {"query": text, "queries": [{**query, **spec}], "diagnostics": True}


def test_search_in_each_mode_shows_both_legs_and_the_funnel(page: Page) -> None:
    text = "restore a base backup and replay WAL"
    for mode in ("dense", "lexical", "hybrid"):
        page.search(text, mode)
        page.shot(f"search-{mode}")
        answer = httpx.post(f"{page.url}/agents/retrieval", json=api_request(text, mode)).json()
        shown = page.hits()
        assert [h["id"] for h in shown] == [h["_id"] for h in answer["hits"]], mode
        assert shown, mode
        for row, hit in zip(shown, answer["hits"], strict=True):
            scores = hit["_index_scores"]
            assert row["score"] == fixed(hit["_score"], 4)
            assert row["title"] == hit["_source"]["title"]
            assert row["chunk"] == str(hit["_chunk"])
            dense = (
                "-"
                if scores["rank_dense"] is None
                else f"#{scores['rank_dense']} {fixed(scores['distance'], 3)}"
            )
            lexical = (
                "-"
                if scores["rank_sparse"] is None
                else f"#{scores['rank_sparse']} {fixed(scores['bm25'], 2)}"
            )
            assert (row["dense"], row["lexical"]) == (dense, lexical), (mode, row)
        if mode == "dense":
            assert all(r["lexical"] == "-" for r in shown)
        if mode == "lexical":
            assert all(r["dense"] == "-" for r in shown)
        # The query's terms are marked in the snippets (lexical hits contain at least one).
        if mode == "lexical":
            marked = {m.text.lower() for m in page.all("#hits tbody .snippet mark")}
            assert marked and all(
                m.startswith(("restor", "base", "backup", "replay", "wal")) for m in marked
            ), marked
        funnel = {
            r.get_attribute("data-label"): int(r.find_element(By.CLASS_NAME, "count").text)
            for r in page.all(".funnel-row")
        }
        params = answer["debug_info"]["queries"][0]["parameters"]
        assert funnel["returned"] == params["result_count"] == len(shown)
        if mode == "hybrid":
            assert funnel["dense raw"] == params["dense_raw_count"]
            assert funnel["lexical raw"] == params["sparse_raw_count"]
            assert funnel["fused candidates"] == params["fused_candidate_count"]
            assert (
                funnel["dense within threshold"] == params["dense_raw_count"] - params["dense_filtered_count"]
            )
        else:
            assert ("lexical raw" in funnel) == (mode == "lexical") and ("dense raw" in funnel) == (
                mode == "dense"
            )


def test_the_form_fits_the_source_the_model_and_the_walk(page: Page) -> None:
    """The threshold the page starts with suits MiniLM, and what the API's default 0.5 removes is said; a
    field chip writes the short filter form; a graph walk switches to the only selection it takes and to a
    graph index; a refused request says there is no walk; a source without an index cannot be walked, and
    the source chosen last is chosen again on the next visit."""
    assert page.find("#threshold").get_attribute("value") == "0.7"
    page.search("restore a base backup and replay WAL", "hybrid", threshold="0.5")
    notices = page.find("#notices")
    assert notices.is_displayed() and "threshold 0.5" in notices.text and "dense candidates" in notices.text
    page.shot("threshold-notice", top="#status")
    page.search("restore a base backup and replay WAL", "hybrid", threshold="0")
    assert not page.find("#notices").is_displayed()

    chip = page.wait(lambda: page.all("#source-info button.field"), "the field chips")[0]
    name = chip.text.split(":")[0]
    chip.click()
    assert page.find("#filter").get_attribute("value").startswith(f'{{"{name}":')

    page.find("#nav summary").click()
    page.find("#nav-on").click()
    page.choose_index("sections")
    Select(page.find("#nav-strategy")).select_by_value("graph")
    assert Select(page.find("#nav-selection")).first_selected_option.get_attribute("value") == "agentic"
    assert not page.find('#nav-selection option[value="ranked"]').is_enabled()
    assert Select(page.find("#nav-index")).first_selected_option.get_attribute("value") == "xref"
    page.fill("#filter", '{"nope": 1}')
    page.search("backup", "lexical")
    assert page.find("#filter-error").is_displayed()
    assert page.find("#walk-info").text == "No walk: the request was refused."

    assert httpx.post(
        f"{page.url}/sources/plain/documents", json=[doc("p", "Plain", "no index here", None)]
    ).is_success
    page.driver.get(f"{page.url}/")
    page.wait(lambda: "plain" in page.sources(), "the new source")
    Select(page.find("#source")).select_by_value("plain")
    page.wait(lambda: not page.find("#nav-on").is_enabled(), "navigation turned off")
    assert "no index" in page.find("#nav-why").get_attribute("textContent")
    page.driver.get(f"{page.url}/")
    page.wait(lambda: "plain" in page.sources(), "the source list")
    assert Select(page.find("#source")).first_selected_option.get_attribute("value") == "plain"
    page.driver.execute_script("localStorage.clear()")


def test_convex_fusion_with_alpha(page: Page) -> None:
    text = "restore a base backup and replay WAL"
    assert not page.find("#alpha").is_enabled()  # alpha weighs convex fusion only
    Select(page.find("#fusion")).select_by_value("convex")
    page.search(text, "hybrid", alpha="0.3")
    answer = httpx.post(
        f"{page.url}/agents/retrieval", json=api_request(text, "hybrid", fusion="convex", alpha=0.3)
    ).json()
    shown = page.hits()
    assert [(h["id"], h["score"]) for h in shown] == [
        (h["_id"], fixed(h["_score"], 4)) for h in answer["hits"]
    ]
    assert "fusion convex" in page.find("#funnel").text
    page.shot("search-convex")


def test_a_bad_filter_shows_the_server_error_at_its_path(page: Page) -> None:
    page.fill(
        "#filter",
        '{"op": "and", "args": [{"op": "eq", "lhs": {"knowledge": "tenant"}, "rhs": {"value": 3}}]}',
    )
    page.search("backup", "lexical")
    error = page.find("#filter-error").text
    assert error.startswith(
        "3007 InvalidParamValue at queries[0].filter.args[0].rhs: filter.type_mismatch"
    ), error
    marked = page.find("#filter-view mark.bad")
    assert marked.get_attribute("data-path") == ".args[0].rhs"
    assert marked.text.startswith('{\n "value": 3') or '"value": 3' in marked.text
    assert not page.hits()
    page.shot("filter-error-at-path")
    # A field the source does not have: the path ends at `lhs`, which holds the unknown name.
    page.fill("#filter", '{"op": "eq", "lhs": {"knowledge": "nope"}, "rhs": {"value": "x"}}')
    page.find("#search").click()
    page.wait(lambda: page.find("#filter-error").is_displayed(), "the filter error")
    assert "at queries[0].filter.lhs" in page.find("#filter-error").text
    assert page.find("#filter-view mark.bad").get_attribute("data-path") == ".lhs"
    # Not JSON at all: said before anything is sent.
    page.fill("#filter", '{"op": ')
    page.find("#search").click()
    assert page.find("#filter-error").text.startswith("invalid JSON")
    # A good filter: the error goes and the hits stay inside it.
    page.fill("#filter", '{"op": "eq", "lhs": {"knowledge": "tenant"}, "rhs": {"value": "hr"}}')
    page.search("secret salary bonus", "lexical")
    assert not page.find("#filter-error").is_displayed()
    assert {h["id"] for h in page.hits()} == {"salaries", "bonus"}


def test_a_hit_opens_its_whole_document(page: Page) -> None:
    page.search("promote the standby when the primary fails", "hybrid")
    first = page.hits()[0]
    page.all("#hits tbody tr")[0].click()
    page.wait(lambda: page.find("#doc").is_displayed(), "the document dialog")
    document = httpx.get(f"{page.url}/sources/runbooks/documents/{first['id']}").json()
    assert page.find("#doc-title").text == document["title"] == first["title"]
    chunks = page.all("#doc-chunks .chunk p")
    assert [c.text for c in chunks] == [c["text"] for c in document["chunks"]]
    assert "tenant" in page.find("#doc-meta").text
    page.shot("document-open")
    page.find("#doc-close").click()
    page.wait(lambda: not page.find("#doc").is_displayed(), "the dialog to close")


def test_a_ranked_tree_walk_draws_its_nodes_in_order(page: Page) -> None:
    page.find("#nav summary").click()
    page.find("#nav-on").click()
    page.choose_index("sections")
    page.fill("#nav-start", "manual")
    page.fill("#nav-beam", "2")
    text = "stop WAL replay at a recovery target time"
    page.search(text, "hybrid")
    request = {
        **api_request(text, "hybrid"),
        "steps": {
            "retrieval": {
                "navigation": {
                    "query_index": 0,
                    "strategy": "tree",
                    "selection": "ranked",
                    "index": "sections",
                    "start_key": "manual",
                    "max_depth": 5,
                    "beam_width": 2,
                }
            }
        },
    }
    answer = httpx.post(f"{page.url}/agents/retrieval", json=request).json()
    walked = [
        s["details"] for s in answer["steps"] if s["name"] == "tree_navigation" and s["id"] != "navigation"
    ]
    order = [s["current_key"] for s in walked]
    assert order[0] == "manual" and "recovery-target" in order

    def drawn() -> list[str]:
        nodes = page.all("#walk li.visited")
        ranked = sorted(nodes, key=lambda n: int(n.find_element(By.CLASS_NAME, "order").text))
        return [n.get_attribute("data-key") or "" for n in ranked]

    page.wait(lambda: drawn() == order, f"the walk {order}")
    # Each visited node sits under its parent, and the unvisited children of visited nodes are greyed.
    for details in walked:
        if details["parent"] is not None:
            parent = page.find(f'#walk li.visited[data-key="{details["parent"]}"]')
            assert parent.find_elements(By.CSS_SELECTOR, f'li.visited[data-key="{details["current_key"]}"]')
    children = set()
    for key in order:
        found = httpx.get(
            f"{page.url}/sources/runbooks/indexes/sections/neighbors", params={"key": key, "max": 256}
        ).json()
        children |= {n["key"] for n in found}
    unvisited = children - set(order)
    assert unvisited, "beam 2 leaves siblings unvisited"
    page.wait(
        lambda: {n.get_attribute("data-key") for n in page.all("#walk li.unvisited")} == unvisited,
        f"the greyed frontier {unvisited}",
    )
    page.wait(lambda: "Backup and Restore" in page.find("#walk").text, "the node titles")
    info = page.find("#walk-info").text
    assert info.startswith(f"tree walk, ranked, index sections: {len(order)} nodes read"), info
    assert page.find("#walk li.visited[data-key=manual] .order").text == "1"
    assert [h["id"] for h in page.hits()] == [h["_id"] for h in answer["hits"]]
    page.shot("navigation-walk", top="#walk-info")


def test_an_agentic_graph_walk_draws_its_path(page: Page, fake: tuple[FakeAnthropicAPI, str]) -> None:
    fake[0].replies.extend(
        [
            reply_tool("navigate", {"next_key": "recovery-target"}),
            reply_tool("navigate", {"next_key": "pitr"}),  # back along the cycle: visited, refused
            reply_text("done"),
        ]
    )
    page.find("#nav summary").click()
    page.find("#nav-on").click()
    Select(page.find("#nav-strategy")).select_by_value("graph")
    Select(page.find("#nav-selection")).select_by_value("agentic")
    page.choose_index("xref")
    page.fill("#nav-start", "pitr")
    page.search("restore to a point in time", "lexical")
    assert not page.find("#error").is_displayed(), page.find("#error").text
    steps = page.all("#walk ol.walk-path li.visited")
    assert [s.get_attribute("data-key") for s in steps] == ["pitr", "recovery-target"]
    assert steps[1].text.startswith("pitr -xref-> 2 recovery-target"), steps[1].text
    assert page.find("#walk-info").text.startswith("graph walk, agentic, index xref: 2 nodes read")
    assert [h["id"] for h in page.hits()] == ["pitr", "recovery-target"]
    page.shot("graph-walk-path", top="#walk-info")


def test_memory_recall_from_a_store(page: Page) -> None:
    records = [
        {"id": "tea", "text": "Alex prefers green tea in the afternoon.", "importance": 4},
        {"id": "allergy", "text": "Alex is allergic to penicillin.", "importance": 9},
    ]
    assert httpx.post(f"{page.url}/memory/alex/records", json=records).status_code in (200, 201)
    page.driver.refresh()
    page.wait(
        lambda: [o.text for o in Select(page.find("#memory-store")).options] == ["alex (2 records)"],
        "the store",
    )
    page.fill("#query", "which antibiotics must Alex avoid?")
    page.find("#memory-recall").click()
    page.wait(lambda: page.all("#memory-list li"), "the recalled memories")
    assert page.all("#results #memory-list li"), "the memories go to the results column, beside the form"
    recalled = httpx.get(
        f"{page.url}/memory/alex",
        params={"query": "which antibiotics must Alex avoid?", "top_k": 5, "touch": "false"},
    ).json()
    shown = page.all("#memory-list li")
    assert [li.get_attribute("data-id") for li in shown] == [c["id"] for c in recalled["candidates"]]
    assert shown[0].get_attribute("data-id") == "allergy"
    assert shown[0].text.startswith("Alex is allergic to penicillin.\nscore ")
    page.shot("memory-recall", top="#memory")


def test_a_script_document_stays_inert(page: Page) -> None:
    page.search("restore drill", "lexical")
    drill = next(h for h in page.hits() if h["id"] == "drill")
    assert drill["title"] == SCRIPT_TITLE
    assert "<script>" in drill["snippet"]
    page.all("#hits tbody tr")[[h["id"] for h in page.hits()].index("drill")].click()
    page.wait(lambda: page.find("#doc").is_displayed(), "the document dialog")
    assert page.find("#doc-title").text == SCRIPT_TITLE
    assert page.find("#doc-chunks .chunk p").text == SCRIPT_TEXT
    page.shot("script-document-inert")
    assert page.driver.execute_script("return window.pwned === undefined")
    assert not page.all("#hits img, #hits script, #hits b:not(:first-child), #doc img, #doc script")
    assert not [e for e in page.driver.get_log("browser") if e["level"] == "SEVERE"]


def test_saved_agents_list_run_and_edit(page: Page) -> None:
    page.search("how do I restore a base backup", "hybrid")
    page.fill("#agent-name", "restorer")
    page.find("#agent-save").click()
    page.wait(lambda: page.all('#agent-list li[data-agent="restorer"]'), "the new agent in the list")
    saved = httpx.get(f"{page.url}/agents/restorer").json()
    assert (saved["retrieval_mode"], saved["top_k"], saved["input"]) == (
        "hybrid",
        10,
        "how do I restore a base backup",
    )
    item = page.find('#agent-list li[data-agent="restorer"]')
    item.find_element(By.XPATH, ".//button[text()='Edit']").click()
    page.fill("#agent-top-k", "2")
    page.fill("#agent-filter", '{"op": "eq", "lhs": {"knowledge": "tenant"}, "rhs": {"value": 1}}')
    page.find("#agent-edit button[type=submit]").click()
    page.wait(lambda: page.find("#agent-error").is_displayed(), "the agent's filter error")
    assert page.find("#agent-error").text.startswith("3007 InvalidParamValue at filter.rhs")
    page.shot("agent-edit-error")
    assert httpx.get(f"{page.url}/agents/restorer").json()["top_k"] == 10  # the previous parameters stay
    page.fill("#agent-filter", "")
    page.find("#agent-edit button[type=submit]").click()
    page.wait(lambda: "top 2" in page.find('#agent-list li[data-agent="restorer"]').text, "the edited agent")
    assert httpx.get(f"{page.url}/agents/restorer").json()["top_k"] == 2
    page.fill("#query", "")
    page.find('#agent-list li[data-agent="restorer"]').find_element(
        By.XPATH, ".//button[text()='Run']"
    ).click()
    page.wait(lambda: page.find("#results").get_attribute("aria-busy") == "false" and page.hits(), "the run")
    ran = httpx.post(f"{page.url}/agents/restorer/run", json={"input": ""}).json()
    assert [h["id"] for h in page.hits()] == [h["_id"] for h in ran["hits"]] and len(ran["hits"]) == 2
    assert page.find("#status").text.startswith("Agent restorer:")
    page.shot("agent-run")


def test_phone_width(page: Page) -> None:
    page.driver.set_window_size(390, 844)
    page.search("restore a base backup", "hybrid")
    assert page.hits()
    # Nothing wider than the screen, the hits table included (its rows become cards).
    width = page.driver.execute_script(
        "const t = document.querySelector('.scroll');"
        "return [document.documentElement.scrollWidth, window.innerWidth, t.scrollWidth, t.clientWidth]"
    )
    assert width[0] <= width[1] and width[2] <= width[3], width
    page.shot("phone-width-form")
    page.shot("phone-width-hits", top="#results")


def test_a_key_is_required_when_principals_exist(
    browser: WebDriver, db_url: str, embedder: Any, screens: Path
) -> None:
    with serve(Settings(database_url=db_url, port=free_port())) as url:
        with httpx.Client(base_url=url) as http:
            assert http.post("/sources/runbooks/documents", json=CORPUS).status_code == 200
        with psycopg.connect(db_url, autocommit=True) as conn:
            configure(conn)
            _, key = create_principal(
                conn, "ops", tables=["runbooks"], row_filter={"tenant": "ops"}, tools=["search"]
            )
        page = Page(browser, url, screens)
        page.wait(lambda: page.find("#notice").is_displayed(), "the key notice")
        assert page.find("#notice").text.startswith("1401 Unauthorized")
        assert "enter an API key" in page.find("#notice").text
        assert page.sources() == []
        page.shot("key-required")
        page.fill("#api-key", key)
        page.find("#key-use").click()
        page.wait(lambda: page.sources() == ["runbooks"], "the sources with the key")
        assert not page.find("#notice").is_displayed()
        page.search("secret salary bonus restore", "lexical")
        ids = {h["id"] for h in page.hits()}
        assert ids and not ids & {"salaries", "bonus"}, ids  # the row filter holds
        stored = page.driver.execute_script(
            "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie"
        )
        assert key not in stored and key not in page.driver.current_url
        page.shot("key-given")


@pytest.mark.corpus
def test_the_manual_walk_from_backup_and_restore_down_to_the_answer(
    browser: WebDriver, db_url: str, embedder: Any, screens: Path
) -> None:
    """What the README promises a new user: search the PostgreSQL manual (the demo corpus, loaded as `make
    run` loads it), open "Backup and Restore", walk the tree from it with a point-in-time question, and see
    the walk reach the recovery section."""
    env = {**os.environ, "DATABASE_URL": db_url}
    loaded = subprocess.run(
        [sys.executable, "-m", "agentdb.cli", "demo", "--no-serve"], env=env, capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr
    with serve(Settings(database_url=db_url, port=free_port())) as url:
        page = Page(browser, url, screens)
        page.search("backup and restore", "lexical", source="pgdocs")
        row = page.find('#hits tbody tr[data-id="backup.html"]')
        row.click()
        page.wait(lambda: page.find("#doc-walk").is_displayed(), "the walk button")
        assert page.find("#doc-title").text == "Backup and Restore"
        page.find("#doc-walk").click()
        assert page.find("#nav-start").get_attribute("value") == "backup.html"
        assert Select(page.find("#nav-index")).first_selected_option.get_attribute("value") == "sections"
        page.search(
            "someone dropped a table at 14:05; bring the cluster back to 14:04", "hybrid", source="pgdocs"
        )
        answer = "continuous-archiving.html#BACKUP-PITR-RECOVERY"
        page.wait(lambda: page.all(f'#walk li.visited[data-key="{answer}"]'), "the walk to reach the answer")
        # The tree is redrawn as the walk's last events arrive: read the start's order through wait, which
        # looks again when the element it found is gone.
        first = '#walk li.visited[data-key="backup.html"] .order'
        page.wait(lambda: page.find(first).text == "1", "the walk to have read backup.html first")
        assert answer in [h["id"] for h in page.hits()[:3]]
        page.wait(lambda: "Recovering Using a Continuous Archive Backup" in page.find("#walk").text, "titles")
        page.shot("manual-walk-hits")
        page.shot("manual-walk-tree", top="#walk-info")
