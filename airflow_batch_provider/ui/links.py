"""Which URLs from XComs a page may turn into links (XComs are user data: anyone allowed to edit one sets it)."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

_LOOPBACK_NAMES = {"localhost"}


def safe_link(url: Any) -> str | None:
    """Return ``url`` if a page may link to it: ``https:``, or ``http:`` to loopback (the emulator); else None.

    ``javascript:``, ``data:`` and every other scheme, a URL with credentials in it, and plain
    ``http:`` to another host are dropped: the value comes from an XCom anyone allowed to edit
    XComs could have set.
    """
    text = str(url or "").strip()
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
    except ValueError:
        return None
    if not host or parts.username or parts.password or any(ord(c) < 0x21 for c in text):
        return None
    if parts.scheme == "https":
        return text
    if parts.scheme == "http" and (host in _LOOPBACK_NAMES or _is_loopback_ip(host)):
        return text
    return None


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
