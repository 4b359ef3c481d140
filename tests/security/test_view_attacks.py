"""Attacks on the "LLM batches" view and the run report route, against a real api-server and a real Chromium.

Issue 25: the report route read whatever path or URL the merge XCom named (another DAG's report,
a URL the server fetched for the caller, a 404 naming the server's home folder); a status name
from the merge XCom reached an admin's page as a tag, a ``javascript:`` console_url became a link;
no CSP, X-Frame-Options or nosniff; the docs and the OpenAPI schema answered without a token.
Every XCom field the view reads is hostile here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from airflow_batch_provider.report.location import published_report
from tests.security.conftest import DAG_ID, ViewServer

pytestmark = [pytest.mark.security, pytest.mark.timeout(600)]

OUTSIDE = "203.0.113.7"  # TEST-NET-3: a request to it is a request the page should never make
HOSTILE = f"\"'><img src=http://{OUTSIDE}/x.png onerror=alert(1)><script>alert(2)</script><svg onload=alert(3)>"
STATUS_TAG = f'"><img src=http://{OUTSIDE}/s.png onerror=alert(4)>'
SECRET_ROWS = "SECRET-ROWS-OF-ANOTHER-DAG"


class _Trap(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        _Trap.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<script>alert('fetched')</script>_REPORT.html")

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def trap() -> Iterator[str]:
    """A local web server that records any request: the api-server must never fetch it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trap)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _hostile_run(server: ViewServer, run_id: str, report: str, numbers: Any = HOSTILE) -> None:
    """A run whose every XCom field the view reads is hostile (``numbers``: what the count fields hold)."""
    server.trigger(DAG_ID, run_id, {})
    stray = [] if numbers == 1 else [HOSTILE]  # a string where a list holds objects
    chunks = [
        {"job_dir": HOSTILE, "chunk_index": i, "label": HOSTILE, "num_requests": numbers, "cost_expected_usd": numbers}
        for i in range(2)
    ] + stray
    server.set_xcom(run_id, "chunk", "return_value", chunks)
    server.set_xcom(run_id, "submit", "return_value", {"job_dir": HOSTILE, "chunk_index": 0, "batch_id": HOSTILE})
    # The mapped sensor has one task instance until it expands (map index -1): one progress record.
    progress = {"job_dir": HOSTILE, "chunk_index": 0, "provider_status": HOSTILE, "completed": numbers,
                "failed": 1 if stray == [] else "1e999", "total": 3, "batch_id": HOSTILE,
                "console_url": "javascript:alert(5)"}  # fmt: skip
    server.set_xcom(run_id, "wait", "llm_batch_progress", progress)
    attempts = [{"batch_id": "b1"}, {"batch_id": HOSTILE}, *stray]
    server.set_xcom(run_id, "wait", "return_value", {"attempts": attempts})
    summary = {"statuses": {HOSTILE: 1, STATUS_TAG: 2}, "input_tokens": numbers, "output_tokens": numbers,
               "actual_cost_usd": numbers, "realtime_cost_usd": numbers, "report": report}  # fmt: skip
    server.set_xcom(run_id, "merge", "return_value", summary)


@pytest.fixture(scope="module")
def runs(view_server: ViewServer, trap: str) -> dict[str, str]:
    """Runs of the example DAG with hostile XComs (run id → what its merge XCom names as the report)."""
    other = published_report("another_dag", "secret_run", "merge", str(view_server.report_root))
    other.parent.mkdir(parents=True)
    other.write_text(f"<html>{SECRET_ROWS}</html>")
    reports = {
        "hostile": f"{trap}/_REPORT.html",
        "elsewhere": str(other),
        "home": "~/_REPORT.html",
        "traversal": f"{view_server.report_root}/../../../etc/_REPORT.html",
    }
    for run_id, report in reports.items():
        _hostile_run(view_server, run_id, report)
    _hostile_run(view_server, "strings", "_REPORT.html", numbers=1)  # hostile text, well-formed numbers
    # A run whose merge did publish its report (what MergeResultsOperator does): the view serves it.
    view_server.trigger(DAG_ID, "published", {})
    view_server.set_xcom("published", "merge", "return_value", {"statuses": {"succeeded": 3}, "report": "x"})
    mine = published_report(DAG_ID, "published", "merge", str(view_server.report_root))
    mine.parent.mkdir(parents=True)
    mine.write_text("<html><body><h1>the run report</h1></body></html>")
    return reports


def _get(server: ViewServer, path: str, auth: bool = True) -> httpx.Response:
    headers = server._headers() if auth else {}
    return httpx.get(f"{server.api_url}/llm-batches{path}", headers=headers, timeout=60)


def test_the_report_comes_only_from_the_run_identity_under_the_configured_root(
    view_server: ViewServer, runs: dict[str, str]
) -> None:
    """No XCom path or URL is ever read or fetched: another DAG's report, a URL, ~ and ../ all get a bare 404."""
    _Trap.hits.clear()
    for run_id in ("hostile", "elsewhere", "home", "traversal"):
        answer = _get(view_server, f"/runs/{DAG_ID}/{run_id}/report")
        assert answer.status_code == 404, (run_id, answer.text)
        assert SECRET_ROWS not in answer.text and "fetched" not in answer.text
        for leak in (str(view_server.root), "/root", "/home", "/etc", "No such file", "Errno"):
            assert leak not in answer.text, (run_id, answer.text)
    assert _Trap.hits == [], "the api-server fetched a URL named in an XCom"
    served = _get(view_server, f"/runs/{DAG_ID}/published/report")
    assert served.status_code == 200 and "the run report" in served.text
    assert "sandbox" in served.headers["content-security-policy"]
    assert "script-src" not in served.headers["content-security-policy"]  # default-src 'none': no script at all


def test_every_route_sends_csp_framing_and_nosniff(view_server: ViewServer, runs: dict[str, str]) -> None:
    answers = {
        "runs": _get(view_server, "/"),
        "run": _get(view_server, f"/runs/{DAG_ID}/hostile"),
        "fragment": _get(view_server, f"/runs/{DAG_ID}/hostile?fragment=1"),
        "report": _get(view_server, f"/runs/{DAG_ID}/published/report"),
        "missing report": _get(view_server, f"/runs/{DAG_ID}/hostile/report"),
        "no such run": _get(view_server, f"/runs/{DAG_ID}/nope"),
        "anonymous": _get(view_server, "/", auth=False),
        "no such page": _get(view_server, "/nothing-here"),
    }
    assert [a.status_code for a in answers.values()] == [200, 200, 200, 200, 404, 404, 401, 404]
    for name, answer in answers.items():
        csp = answer.headers.get("content-security-policy", "")
        assert "default-src 'none'" in csp and "frame-ancestors 'self'" in csp, name
        script_src = [d for d in csp.split(";") if d.strip().startswith("script-src")]
        assert all("'sha256-" in d and "unsafe" not in d for d in script_src), (name, csp)
        assert answer.headers.get("x-frame-options") == "SAMEORIGIN", name
        assert answer.headers.get("x-content-type-options") == "nosniff", name


def test_docs_redoc_and_openapi_are_off(view_server: ViewServer) -> None:
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        for auth in (False, True):
            assert _get(view_server, path, auth=auth).status_code == 404, (path, auth)


@pytest.mark.parametrize("run_id", ["hostile", "strings"])
def test_hostile_values_come_back_escaped(view_server: ViewServer, runs: dict[str, str], run_id: str) -> None:
    """The page's HTML holds every hostile value as text: no tag, no event handler, no unsafe link."""
    answer = _get(view_server, f"/runs/{DAG_ID}/{run_id}")
    assert answer.status_code == 200, answer.text  # malformed numbers show as dashes, not as a 500
    page = answer.text
    shown = escape(HOSTILE)
    # Every field reached the page (as text): labels, provider status, batch ids, status names, follow-ups.
    assert page.count(f"<td>{shown}</td>") >= 1 and f"<span class='status'>{shown}</span>" in page
    assert "<code class='batch'>b1</code>" in page and f"<code class='followup'>+\u00a0{shown}</code>" in page
    assert f'data-testid="status-{shown}"' in page
    assert HOSTILE not in page
    assert page.count("<script") == 1  # the view's own refresh script
    for injected in ("<img", "<svg onload", "<script>alert", 'href="javascript'):
        assert injected not in page, injected
    assert 'data-testid="status-&quot;&gt;&lt;img' in page
    assert page.count('class="console"') == 0  # a javascript: console_url is no link


def _requests_made(driver: Any) -> list[str]:
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _login(driver: Any, server: ViewServer) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{server.api_url}/auth/login")
    wait = WebDriverWait(driver, 60)
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(server._password())
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: any(c["name"] == "_token" for c in d.get_cookies()))


def _assert_nothing_ran(driver: Any, what: str) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        text = driver.switch_to.alert.text
        pytest.fail(f"{what}: an alert opened ({text!r})")
    except NoAlertPresentException:
        pass
    counts = driver.execute_script(
        "return {img: document.querySelectorAll('img').length, svg: document.querySelectorAll('svg[onload]').length,"
        " handlers: document.querySelectorAll('[onerror],[onload],[onclick]').length,"
        " js: Array.from(document.links).filter(a => !/^https?:/.test(a.href)).length};"
    )
    assert counts == {"img": 0, "svg": 0, "handlers": 0, "js": 0}, (what, counts)


def test_chromium_runs_no_injected_script(chromium: Any, view_server: ViewServer, runs: dict[str, str]) -> None:
    """An admin opens every page with hostile XComs: no dialog, no outside request, no injected element."""
    import time

    _login(chromium, view_server)
    chromium.get_log("performance")  # drop the login's requests
    pages = {
        "run list": "/",
        "run with well-formed numbers": f"/runs/{DAG_ID}/strings",
        "run": f"/runs/{DAG_ID}/hostile",
        "report of another DAG": f"/runs/{DAG_ID}/elsewhere/report",
        "report": f"/runs/{DAG_ID}/published/report",
    }
    for what, path in pages.items():
        chromium.get(f"{view_server.api_url}/llm-batches{path}")
        _assert_nothing_ran(chromium, what)
        if path.startswith("/runs/") and not path.endswith("/report"):
            scripts = chromium.execute_script("return document.scripts.length")
            assert scripts == 1, f"{scripts} script elements on the run page"
            time.sleep(4)  # one refresh: the fragment swapped in must be as inert
            _assert_nothing_ran(chromium, "run after a refresh")
    hosts = {urlsplit(url).hostname for url in _requests_made(chromium) if url.startswith("http")}
    assert hosts <= {"127.0.0.1"}, f"the pages made requests to {hosts}"
    refused = [e["message"] for e in chromium.get_log("browser") if "Refused to execute" in e["message"]]
    assert refused == [], "the view's own script was blocked: SCRIPT_HASH does not match the page"


def test_bad_numbers_and_types_in_xcoms_break_no_page(view_server: ViewServer, runs: dict[str, str]) -> None:
    """Issue 38 item 5 on the real api-server: one huge integer or a wrong type in a run's XComs."""
    run_id = "numbers"
    view_server.trigger(DAG_ID, run_id, {})
    chunk = {"job_dir": "/j", "chunk_index": 0, "label": "c", "num_requests": 10**4000, "cost_expected_usd": 10**4000}
    view_server.set_xcom(run_id, "chunk", "return_value", [chunk])
    view_server.set_xcom(run_id, "merge", "return_value", {"top_errors": 5, "actual_cost_usd": 10**4000})
    pages = {"/": 200, f"/runs/{DAG_ID}/{run_id}": 200, f"/runs/{DAG_ID}/{run_id}?task_id=wait&map_index=²": 200,
             f"/runs/{DAG_ID}/{run_id}?task_id=wait&map_index={'9' * 5000}": 200}  # fmt: skip
    for path, status in pages.items():
        answer = _get(view_server, path)
        assert answer.status_code == status, (path, answer.text[:300])
    assert "unreadable value" in _get(view_server, f"/runs/{DAG_ID}/{run_id}").text
    assert "unreadable value" in _get(view_server, "/").text and ">published</a>" in _get(view_server, "/").text


def test_a_link_in_the_report_root_serves_nothing(view_server: ViewServer, runs: dict[str, str]) -> None:
    """Issue 38 item 6 on the real api-server: the run's report is a link to the system's password file."""
    run_id = "linked"
    view_server.trigger(DAG_ID, run_id, {})
    view_server.set_xcom(run_id, "merge", "return_value", {"statuses": {"succeeded": 1}, "report": "x"})
    report = published_report(DAG_ID, run_id, "merge", str(view_server.report_root))
    report.parent.mkdir(parents=True)
    report.symlink_to("/etc/passwd")
    answer = _get(view_server, f"/runs/{DAG_ID}/{run_id}/report")
    assert answer.status_code == 404 and "root:" not in answer.text


def test_the_extra_links_api_returns_no_hostile_stored_link(view_server: ViewServer, runs: dict[str, str]) -> None:
    """Issue 38 item 10: Airflow's API returned the ``_link_BatchConsoleLink`` XCom as stored."""
    stored = {"submit": "javascript:alert(6)", "wait": "https://evil.example/batches/batch_1"}
    for task_id, url in stored.items():
        view_server.set_xcom("strings", task_id, "_link_BatchConsoleLink", url)
        links = view_server.api("GET", f"/dags/{DAG_ID}/dagRuns/strings/taskInstances/{task_id}/links")
        assert links["extra_links"]["Provider batch"] is None, links
    view_server.set_xcom("strings", "merge", "_link_RunReportLink", "javascript:alert(7)")
    links = view_server.api("GET", f"/dags/{DAG_ID}/dagRuns/strings/taskInstances/merge/links")
    assert links["extra_links"]["Run report"].endswith(f"/llm-batches/runs/{DAG_ID}/strings/report"), links
