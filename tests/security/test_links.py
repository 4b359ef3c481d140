"""Issue 25: the view linked any ``console_url`` an XCom named (``javascript:`` reached an admin's page).

Only ``https:`` links, and ``http:`` to loopback (the bundled emulator), are made; the page test
(test_view_attacks.py) shows a hostile one rendered as plain text.
"""

from __future__ import annotations

import pytest

from airflow_batch_provider.ui.pages import safe_link

pytestmark = pytest.mark.security


@pytest.mark.parametrize(
    ("url", "linked"),
    [
        ("https://platform.openai.com/batches/b1", True),
        ("http://127.0.0.1:8080/v1/batches/b1", True),
        ("http://localhost:8080/b", True),
        ("http://[::1]:8080/b", True),
        ("javascript:alert(1)", False),
        ("JaVaScRiPt:alert(1)", False),
        (" javascript:alert(1)", False),
        ("java\tscript:alert(1)", False),
        ("data:text/html,<script>alert(1)</script>", False),
        ("http://203.0.113.7/b", False),
        ("http://127.0.0.1.evil.example/b", False),
        ("https://user:pw@platform.openai.com/b", False),
        ("//evil.example/b", False),
        ("https://[bad", False),
        ("", False),
    ],
)
def test_only_https_or_loopback_http_links_are_made(url: str, linked: bool) -> None:
    assert (safe_link(url) is not None) is linked
