"""The "LLM batches" view and the run report, as a person sees them: a real api-server, a real browser.

A headless Chromium logs in to the Airflow UI, opens the view's tab on a finished run of the example
DAG (one row per chunk, the right counts), follows the provider link and the run report, and watches
the progress bar of a live run move on a slow emulator. A run with line errors and follow-up batches
shows its failures with example row ids before the merge, then done == requests for every chunk, and
never scrolls sideways at 1280 px. Screenshots go to the test's tmp folder; assertions read the DOM,
never pixels. The endpoints refuse a caller without a valid Airflow token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.scheduler.deployment import Deployment
from tests.ui.conftest import DAG_ID, NO_ROLE_USER

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

ROWS, CHUNK_SIZE = 300, 100
CHUNKS = ROWS // CHUNK_SIZE


def _conf(deployment: Deployment, name: str, rows: int) -> dict[str, Any]:
    output = deployment.root / "out" / name
    return {"rows": rows, "chunk_size": CHUNK_SIZE, "poll_interval": 1, "output_dir": str(output)}


def _login(driver: Any, deployment: Deployment) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{deployment.api_url}/auth/login")
    wait = WebDriverWait(driver, 60)
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(deployment._password())
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: any(c["name"] == "_token" for c in d.get_cookies()))


def _rows(driver: Any) -> list[dict[str, int]]:
    """Read every chunk row's counts in one script call: the live page swaps its content while we read."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#chunks tr.chunk')).map(function (tr) {"
            " return {chunk: +tr.dataset.chunk, completed: +tr.dataset.completed,"
            " failed: +tr.dataset.failed, total: +tr.dataset.total}; });"
        )
    )


@pytest.fixture(scope="module")
def finished_run(ui_deployment: Deployment) -> str:
    """A successful run of the example DAG: 300 rows in 3 chunks."""
    run_id = "ui_finished"
    ui_deployment.trigger(DAG_ID, run_id, _conf(ui_deployment, run_id, ROWS))
    assert ui_deployment.wait_for_run(DAG_ID, run_id, timeout=300) == "success", ui_deployment.diagnostics()
    return run_id


def _token(deployment: Deployment, username: str) -> dict[str, str]:
    passwords = json.loads((deployment.home / "simple_auth_manager_passwords.json.generated").read_text())
    response = httpx.post(
        f"{deployment.api_url}/auth/token", json={"username": username, "password": passwords[username]}, timeout=30
    )
    response.raise_for_status()
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def test_view_endpoints_refuse_callers_without_a_valid_token(ui_deployment: Deployment, finished_run: str) -> None:
    """Plugin apps are not protected by Airflow: ours must answer 401/403 itself, and 200 to a real user.

    Anonymous: 401. A forged token (header or cookie): 403. A real user the auth manager gives no
    access to the DAG: 403, and the run list shows it nothing.
    """
    url = f"{ui_deployment.api_url}/llm-batches/runs/{DAG_ID}/{finished_run}"
    with httpx.Client(timeout=30) as http:
        for path in ("", "/report"):
            assert http.get(url + path).status_code == 401
            assert http.get(url + path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
            assert http.get(url + path, headers={"Cookie": "_token=forged"}).status_code == 403
        assert http.get(f"{ui_deployment.api_url}/llm-batches/").status_code == 401
        nobody = _token(ui_deployment, NO_ROLE_USER)
        for path in ("", "/report"):
            assert http.get(url + path, headers=nobody).status_code == 403
        listing = http.get(f"{ui_deployment.api_url}/llm-batches/", headers=nobody)
        assert listing.status_code == 200 and finished_run not in listing.text
        token = ui_deployment._headers()
        assert http.get(url, headers=token).status_code == 200
        assert http.get(url + "/report", headers=token).status_code == 200
        assert finished_run in http.get(f"{ui_deployment.api_url}/llm-batches/", headers=token).text
        assert "llm_batch_progress" not in http.get(url, headers=token).text  # no raw XCom leaks into the page


def test_view_shows_each_chunk_and_links_to_the_provider_and_the_report(
    ui_deployment: Deployment, finished_run: str, browser: Any, tmp_path: Path
) -> None:
    """Log in, open the run's "LLM batches" tab: one row per chunk with its counts; open the links."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver, wait = browser, WebDriverWait(browser, 60)
    _login(driver, ui_deployment)
    driver.get(f"{ui_deployment.api_url}/dags/{DAG_ID}/runs/{finished_run}/plugin/llm-batches-run")
    frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='/llm-batches/runs/']")))
    driver.save_screenshot(str(tmp_path / "run-tab.png"))
    driver.switch_to.frame(frame)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#chunks tr.chunk")))
    rows = _rows(driver)
    assert [r["chunk"] for r in rows] == list(range(CHUNKS))
    assert all(r["completed"] == r["total"] == CHUNK_SIZE and r["failed"] == 0 for r in rows), rows
    assert driver.find_element(By.CSS_SELECTOR, "[data-testid=total-rows] b").text == f"{ROWS:,}"
    assert driver.find_element(By.CSS_SELECTOR, "[data-testid=total-completed] b").text == f"{ROWS:,}"
    assert driver.find_element(By.CSS_SELECTOR, "[data-testid=run-state]").text == "success"
    statuses = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#chunks span.status")]
    assert statuses == ["completed"] * CHUNKS

    # The provider console link: the hooks give one only for the providers' own API hosts, so on the
    # emulator each row names its batch (one per chunk) instead of linking to a console it does not have.
    assert not driver.find_elements(By.CSS_SELECTOR, "#chunks a.console")
    batch_ids = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#chunks code.batch")]
    assert len(set(batch_ids)) == CHUNKS and all(b.startswith("batch_") for b in batch_ids), batch_ids

    # The run report opens from the view (and is the one the merge wrote next to the output).
    driver.switch_to.default_content()
    driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe[src*='/llm-batches/runs/']"))
    before = set(driver.window_handles)
    driver.save_screenshot(str(tmp_path / "run-tab-rows.png"))
    driver.find_element(By.ID, "report-link").click()
    wait.until(lambda d: len(set(d.window_handles) - before) == 1)
    driver.switch_to.window((set(driver.window_handles) - before).pop())
    wait.until(ec.presence_of_element_located((By.ID, "statuses")))
    driver.save_screenshot(str(tmp_path / "report.png"))
    assert "LLM batch run report" in driver.find_element(By.TAG_NAME, "h1").text
    assert driver.find_element(By.CSS_SELECTOR, "#statuses tr[data-status=succeeded] td.n").text == f"{ROWS:,}"
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg")) >= 3  # status, latency timeline, cost
    assert len(driver.find_elements(By.CSS_SELECTOR, "#chunks tr[data-chunk]")) == CHUNKS
    assert (ui_deployment.root / "out" / finished_run / "_REPORT.html").exists()
    driver.close()
    driver.switch_to.window(driver.window_handles[0])

    # The navigation entry lists the run.
    driver.get(f"{ui_deployment.api_url}/plugin/llm-batches")
    frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='/llm-batches/']")))
    driver.switch_to.frame(frame)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#runs a.run")))
    assert finished_run in [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#runs a.run")]
    driver.switch_to.default_content()


def test_progress_bar_moves_while_the_run_is_live(ui_deployment: Deployment, browser: Any, tmp_path: Path) -> None:
    """On a slow emulator the open page refreshes itself and a chunk's bar grows between polls.

    The sensor publishes a chunk's progress once before it defers; every later value comes from the
    trigger on the triggerer, so one row taking two values between 0 and its total proves both the
    trigger's writes and the page's refresh.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver, run_id = browser, "ui_live"
    rows = 2 * CHUNK_SIZE
    if not any(c["name"] == "_token" for c in driver.get_cookies()):
        _login(driver, ui_deployment)
    with ui_deployment.faults(slow=60):  # each batch spends ~60 s in progress, its lines done one by one
        ui_deployment.trigger(DAG_ID, run_id, _conf(ui_deployment, run_id, rows))
        driver.get(f"{ui_deployment.api_url}/llm-batches/runs/{DAG_ID}/{run_id}")
        driver.execute_script("window.__notReloaded = true")
        seen: dict[int, list[int]] = {}

        def moved() -> bool:
            for row in _rows(driver):
                values = seen.setdefault(row["chunk"], [])
                if 0 < row["completed"] < row["total"] and row["completed"] not in values:
                    values.append(row["completed"])
            return any(len(values) >= 2 for values in seen.values())

        WebDriverWait(driver, 240, poll_frequency=0.5).until(lambda d: moved())
        driver.save_screenshot(str(tmp_path / "live.png"))
        assert all(values == sorted(values) for values in seen.values()), seen
        assert driver.execute_script("return window.__notReloaded === true")  # refreshed in place
        widths = driver.execute_script(
            "return Array.from(document.querySelectorAll('#chunks tr.chunk .meter rect.ok')).map(r => +r.getAttribute('width'))"
        )
        assert any(0 < width < 100 for width in widths), widths  # a bar part way, drawn without inline style
        assert driver.find_element(By.CSS_SELECTOR, "[data-testid=run-state]").text == "running"
    assert ui_deployment.wait_for_run(DAG_ID, run_id, timeout=300) == "success"
    WebDriverWait(driver, 30).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[data-testid=run-state]"), "success")
    )
    assert sum(r["completed"] for r in _rows(driver)) == rows


_NO_SIDE_SCROLL = "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"


def _waits(deployment: Deployment, run_id: str) -> list[dict[str, Any]]:
    """The run's wait task instances through the public REST API (state and the label Airflow shows)."""
    url = f"{deployment.api_url}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?task_id=wait&limit=100"
    response = httpx.get(url, headers=deployment._headers(), timeout=30)
    response.raise_for_status()
    return [ti for ti in response.json()["task_instances"] if ti["task_id"] == "wait"]


def test_counts_span_follow_up_batches_and_failures_show_before_the_merge(
    ui_deployment: Deployment, browser: Any, tmp_path: Path
) -> None:
    """Issue 27: a run with line errors and follow-up batches, watched live and after the merge.

    5 % of the lines are invalid (final, a 400) and 10 % hit a server error (resent in follow-up
    batches); each batch spends ~12 s in progress. While a follow-up runs, before the merge, the view
    lists the final failures with example row ids and a next step. Once the run is over each chunk's
    done / total is its request count (all batches counted, each line once), and neither the page
    nor the Airflow UI tab that frames it scrolls sideways at 1280 px.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver, run_id = browser, "ui_line_errors"
    if not any(c["name"] == "_token" for c in driver.get_cookies()):
        _login(driver, ui_deployment)
    conf = {**_conf(ui_deployment, run_id, ROWS), "max_failure_ratio": None}
    with ui_deployment.faults(seed=27, invalid_line_rate=0.05, line_error_rate=0.1, slow=12):
        ui_deployment.trigger(DAG_ID, run_id, conf)
        driver.get(f"{ui_deployment.api_url}/llm-batches/runs/{DAG_ID}/{run_id}")
        final_ids = "#chunks tr.chunk-errors li[data-final='1'] .ids code"
        # A chunk's final failures are recorded when its first batch's results are read, a moment before
        # its follow-up batch is created: wait for both (the follow-up then spends ~12 s in progress).
        WebDriverWait(driver, 240, poll_frequency=0.5).until(
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, final_ids)
                and d.find_elements(By.CSS_SELECTOR, "#chunks code.followup")
            )
        )
        driver.save_screenshot(str(tmp_path / "live-failures.png"))
        assert driver.find_element(By.CSS_SELECTOR, "[data-testid=run-state]").text == "running"
        assert not driver.find_elements(By.ID, "report-link")  # the merge has not run
        kinds = driver.find_elements(By.CSS_SELECTOR, "#error-kinds tbody tr[data-final='1']")
        assert kinds and "invalid_request_error" in kinds[0].text and "fix these rows" in kinds[0].text
        assert driver.execute_script(_NO_SIDE_SCROLL)
        waits = _waits(ui_deployment, run_id)  # item 6: a wait task is named once it runs, not only once deferred
        started = [ti for ti in waits if ti["state"] in ("running", "deferred", "success")]
        assert started and all(ti["rendered_map_index"] for ti in started), waits
        assert ui_deployment.wait_for_run(DAG_ID, run_id, timeout=300) == "success", ui_deployment.diagnostics()
    WebDriverWait(driver, 30).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[data-testid=run-state]"), "success")
    )
    driver.save_screenshot(str(tmp_path / "after-merge.png"))
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#chunks tr.chunk')).map(function (tr) {"
        " return {done: +tr.dataset.done, total: +tr.dataset.total, failed: +tr.dataset.failed,"
        " batches: +tr.querySelector('td.batches').dataset.batches}; });"
    )
    assert [(r["done"], r["total"]) for r in rows] == [(CHUNK_SIZE, CHUNK_SIZE)] * CHUNKS, rows
    assert all(r["batches"] >= 2 for r in rows), rows  # every chunk needed a follow-up
    failed = int(driver.find_element(By.CSS_SELECTOR, "[data-testid=total-failed] b").text.replace(",", ""))
    assert failed == sum(r["failed"] for r in rows) > 0  # the merge agrees with the chunks' own counts
    assert driver.find_elements(By.CSS_SELECTOR, "#error-kinds td.ids code")  # example ids after the merge too
    assert driver.execute_script(_NO_SIDE_SCROLL)

    # The same page inside the Airflow UI's run tab (narrower: the UI's navigation takes its share).
    driver.get(f"{ui_deployment.api_url}/dags/{DAG_ID}/runs/{run_id}/plugin/llm-batches-run")
    frame = WebDriverWait(driver, 60).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='/llm-batches/runs/']"))
    )
    assert driver.execute_script(_NO_SIDE_SCROLL)
    driver.switch_to.frame(frame)
    WebDriverWait(driver, 60).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#chunks tr.chunk")))
    assert driver.execute_script(_NO_SIDE_SCROLL)
    driver.switch_to.default_content()
    driver.save_screenshot(str(tmp_path / "run-tab-line-errors.png"))

    # The runs list: progress, failed and cost columns.
    driver.get(f"{ui_deployment.api_url}/llm-batches/")
    row = driver.find_element(By.XPATH, f"//table[@id='runs']//tr[td/a[text()='{run_id}']]")
    progress = row.find_element(By.CSS_SELECTOR, "td.progress")
    assert progress.get_attribute("data-done") == progress.get_attribute("data-total") == str(ROWS)
    assert row.find_element(By.CSS_SELECTOR, "td.failed").text == f"{failed:,}"
    assert row.find_element(By.CSS_SELECTOR, "td.cost").text.startswith("$")
    assert driver.execute_script(_NO_SIDE_SCROLL)
    driver.save_screenshot(str(tmp_path / "runs.png"))
