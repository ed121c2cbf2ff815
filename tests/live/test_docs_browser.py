"""/docs in a real browser: the OS's headless Chromium, driven by selenium, loads Swagger UI from
a live server, runs one v2 inference and one /v1 batch through the page as a person would (the
first model of the list with the first request example; the batch's JSON example), reads each
response's status in the page, and sees no request leave 127.0.0.1 (Chrome's network events, from
its performance log).

Skipped, saying why, only where no Chromium and chromedriver can be found (.ci/run installs them
from the OS's packages)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.live import LiveServer

from tensorbits_protocol.operators import OPERATORS

pytestmark = pytest.mark.integration

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev group")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

WAIT_S = 15
CHROMIUM = [os.environ.get("TENSORBITS_CHROMIUM", ""), "/usr/bin/chromium", "chromium"]
CHROMEDRIVER = [os.environ.get("TENSORBITS_CHROMEDRIVER", ""), "/usr/bin/chromedriver"]
# Schemes that never reach a network: the page's own blobs (Swagger UI's download link) and
# inline data.
LOCAL_SCHEMES = {
    "blob",
    "data",
    "about",
    "chrome",
    "chrome-untrusted",
    "chrome-extension",
    "devtools",
}


def _which(candidates: list[str]) -> str | None:
    for candidate in candidates:
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, chromedriver = _which(CHROMIUM), _which(CHROMEDRIVER)
    if chromium is None or chromedriver is None:
        pytest.skip(
            "no Chromium and chromedriver on this machine (apt-get install chromium "
            "chromium-driver; .ci/run does)"
        )
    profile = tempfile.mkdtemp(prefix="tensorbits-chromium-")
    options = Options()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,2000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    try:
        driver.set_page_load_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _log(driver: WebDriver, kind: str) -> list[dict[str, Any]]:
    """The entries of Chrome's ``kind`` log since the last read (selenium leaves it untyped)."""
    entries: list[dict[str, Any]] = driver.get_log(kind)  # type: ignore[no-untyped-call]
    return entries


def _requested_urls(driver: WebDriver) -> list[str]:
    """Every URL the page asked for since the last call (Chrome's Network.requestWillBeSent)."""
    urls = []
    for entry in _log(driver, "performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _operation(driver: WebDriver, operation_id: str) -> WebElement:
    """The operation's block, expanded, with "Try it out" clicked."""
    block: WebElement = WebDriverWait(driver, WAIT_S).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f"[id$='-{operation_id}']"))
    )
    driver.execute_script("arguments[0].scrollIntoView()", block)
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    try_out = WebDriverWait(block, WAIT_S).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, "button.try-out__btn"))
    )
    try_out.click()
    return block


def _execute(block: WebElement) -> tuple[str, WebElement]:
    """Click "Execute"; the response status the page shows, and the response's table row."""
    block.find_element(By.CSS_SELECTOR, "button.execute").click()
    response: WebElement = WebDriverWait(block, WAIT_S).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, ".live-responses-table tbody .response"))
    )
    status = response.find_element(By.CSS_SELECTOR, ".response-col_status").text.strip()
    return status, response


def _body_text(block: WebElement) -> str:
    return str(block.find_element(By.CSS_SELECTOR, ".body-param textarea").get_attribute("value"))


def test_docs_page_runs_v2_inference_and_v1_batch_offline(
    browser: WebDriver, live_server: LiveServer
) -> None:
    browser.get("about:blank")
    _log(browser, "performance")  # from here on
    browser.get(f"{live_server.base_url}/docs")

    # v2 inference: the model is a list of the operators, the first preselected, and the first
    # request example fits it as it stands.
    infer = _operation(browser, "model_infer")
    model = Select(infer.find_element(By.CSS_SELECTOR, "tr[data-param-name='model'] select"))
    assert [o.text for o in model.options] == [op.name for op in OPERATORS]
    assert model.first_selected_option.text == OPERATORS[0].name
    request: dict[str, Any] = json.loads(_body_text(infer))
    assert [i["name"] for i in request["inputs"]] == list(OPERATORS[0].inputs)
    status, response = _execute(infer)
    answer = response.find_element(By.CSS_SELECTOR, ".response-col_description pre").text
    assert status == "200", answer
    assert json.loads(answer)["model_name"] == OPERATORS[0].name
    a, b = (i["data"] for i in request["inputs"])
    assert json.loads(answer)["outputs"][0]["data"] == [x & y for x, y in zip(a, b, strict=True)]

    # /v1 batch: JSON is the body offered first, its example runs (zero-filled buffers only),
    # and the binary answer is offered for download.
    batch = _operation(browser, "v1_batch")
    header: dict[str, Any] = json.loads(_body_text(batch))
    assert all(b.get("init") == "zeros" for b in header["buffers"]), header
    status, response = _execute(batch)
    assert status == "200", response.text
    shown = response.find_element(
        By.XPATH, ".//h5[text()='Response headers']/following-sibling::pre"
    ).text
    headers = dict(line.strip().split(": ", 1) for line in shown.splitlines() if ": " in line)
    assert headers["content-type"] == "application/octet-stream", headers
    output_bytes = sum(b["byte_size"] for b in header["buffers"] if b["name"] in header["outputs"])
    length = int(headers["inference-header-content-length"])
    if "content-encoding" in headers:  # a browser asks for gzip, and the server honours it
        assert headers["content-encoding"] in ("gzip", "deflate"), headers
    else:
        assert int(headers["content-length"]) == length + output_bytes, headers
    link = response.find_element(By.CSS_SELECTOR, "a[href^='blob:']")
    assert link.text == "Download file"

    urls = _requested_urls(browser)
    base = urlsplit(live_server.base_url)
    paths = [urlsplit(u).path for u in urls]
    assert f"/v2/models/{OPERATORS[0].name}/infer" in paths, urls
    assert "/v1/batch" in paths, urls
    away = [
        u
        for u in urls
        if urlsplit(u).scheme not in LOCAL_SCHEMES
        and (urlsplit(u).hostname, urlsplit(u).port) != (base.hostname, base.port)
    ]
    assert not away, f"the page asked for something off the machine: {away}"
    errors = [e for e in _log(browser, "browser") if e.get("level") == "SEVERE"]
    assert not errors, errors
