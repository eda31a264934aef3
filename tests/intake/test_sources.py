"""The source-address allowlist, and X-Forwarded-For only from trusted proxies."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from app.config import TELEGRAM_SOURCES
from app.http.sources import client_address, source_allowed
from tests.conftest import table_rows
from tests.intake.conftest import SECRET, Serve, post

TELEGRAM = [ipaddress.ip_network(n) for n in TELEGRAM_SOURCES]
PROXIES = [ipaddress.ip_network("10.0.0.0/8")]


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("149.154.167.99", None, "149.154.167.99"),
        ("8.8.8.8", "149.154.167.99", "8.8.8.8"),  # an untrusted peer's header is ignored
        ("10.0.0.5", "149.154.167.99", "149.154.167.99"),
        ("10.0.0.5", "1.2.3.4, 149.154.167.99, 10.0.0.9", "149.154.167.99"),  # from the right
        ("10.0.0.5", "garbage", None),
        ("10.0.0.5", "10.0.0.7, 10.0.0.8", "10.0.0.7"),
        (None, None, None),
        ("not-an-ip", None, None),
        ("::ffff:149.154.167.99", None, "149.154.167.99"),  # IPv4 on a dual-stack socket
        ("10.0.0.5", "::ffff:149.154.167.99", "149.154.167.99"),
    ],
)
def test_client_address_reads_forwarded_for_only_from_trusted_proxies(
    peer: str | None, forwarded: str | None, expected: str | None
) -> None:
    address = client_address(peer, forwarded, PROXIES)
    assert (None if address is None else str(address)) == expected


def test_source_allowed_admits_everything_without_an_allowlist() -> None:
    assert source_allowed(None, [])
    assert source_allowed(ipaddress.ip_address("8.8.8.8"), [])
    assert source_allowed(ipaddress.ip_address("91.108.4.1"), TELEGRAM)
    assert not source_allowed(ipaddress.ip_address("91.108.8.1"), TELEGRAM)
    assert not source_allowed(None, TELEGRAM)


@pytest.mark.parametrize(
    ("settings", "forwarded", "status"),
    [
        ({"allowed_sources": "telegram"}, None, 403),  # the test client is 127.0.0.1
        ({"allowed_sources": "telegram"}, "149.154.167.99", 403),  # peer not a trusted proxy
        ({"allowed_sources": "telegram", "trusted_proxies": "127.0.0.1"}, "149.154.167.99", 200),
        ({"allowed_sources": "telegram", "trusted_proxies": "127.0.0.1"}, "8.8.8.8", 403),
        ({"allowed_sources": "127.0.0.0/8"}, None, 200),
    ],
    ids=["outside", "spoofed-header", "via-trusted-proxy", "proxied-outsider", "local-range"],
)
async def test_intake_enforces_the_allowlist(
    intake: Serve, settings: dict[str, str], forwarded: str | None, status: int
) -> None:
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    async with intake(**settings) as (base, url), httpx.AsyncClient() as client:
        response = await post(client, base, '{"update_id": 3}', headers=headers)
        rows = table_rows(url, "update_id")
    assert response.status_code == status
    assert rows == ([(3,)] if status == 200 else [])


async def test_every_forwarded_for_line_counts(intake: Serve) -> None:
    # A proxy that adds its own X-Forwarded-For line below the client's: the client's
    # claim comes first and must not be believed.
    settings = {"allowed_sources": "telegram", "trusted_proxies": "127.0.0.1"}
    headers = [
        ("x-forwarded-for", "149.154.167.99"),
        ("x-forwarded-for", "8.8.8.8"),
        ("x-telegram-bot-api-secret-token", SECRET),
        ("content-type", "application/json"),
    ]
    async with intake(**settings) as (base, url), httpx.AsyncClient() as client:
        response = await client.post(
            f"{base}/telegram/shop", content=b'{"update_id": 4}', headers=headers
        )
        rows = table_rows(url, "update_id")
    assert response.status_code == 403
    assert rows == []
