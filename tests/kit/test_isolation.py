"""The kit imports with none of the service's own dependencies: a downstream installs only
httpx and pydantic, and SQLAlchemy for the fence (`telegram_intake_kit.fence`). Checked in a fresh
interpreter whose imports of those packages fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "psycopg",
    "aiosqlite",
    "aiohttp",
    "uvicorn",
    "standardwebhooks",
    "alembic",
    "opentelemetry",  # optional: the handlers continue a trace where the bot traces
    "app",
)


def blocker(blocked: tuple[str, ...]) -> str:
    """What runs first in the child: any import of a blocked package (or a submodule)
    raises."""
    return textwrap.dedent(
        f"""
    import sys

    BLOCKED = {blocked!r}

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"blocked for this test: {{name}}")
            return None

    already = [n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED)]
    assert not already, f"imported before the blocker: {{already}}"
    sys.meta_path.insert(0, Refuse())
    """
    )


USE_THE_KIT = textwrap.dedent(
    """
    import asyncio
    import httpx
    import telegram_intake_kit
    from telegram_intake_kit import Identity, IntakeClient, read_forwarded, sign

    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"update_id": 7}'
    headers = {
        "x-intake-bot": "shop",
        "x-intake-update-id": "7",
        "x-intake-attempt": "1",
        "x-intake-claim-id": "c-1",
        "webhook-id": "shop:7",
        "webhook-timestamp": "1700000000",
        "webhook-signature": sign(secret, "shop:7", 1700000000, body),
    }
    forwarded = read_forwarded(headers, body, signing_secret=secret, now=1700000000)
    assert forwarded.identity == Identity(bot="shop", update_id=7, attempt=1, claim_id="c-1")

    def answer(request):
        assert request.url.path == "/v1/claims/owns"
        assert request.headers["authorization"] == "Bearer k"
        return httpx.Response(200, json={"owned": True, "lease_expires_at": 5})

    async def ask():
        async with IntakeClient("http://intake", "k", transport=httpx.MockTransport(answer)) as c:
            return await c.owns(forwarded.identity)

    owned = asyncio.run(ask())
    assert owned.owned and owned.lease_expires_at == 5
    loaded = [n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED)]
    assert not loaded, loaded
    print("kit ok")
    """
)


# The fence needs SQLAlchemy, and nothing else of the service: a synchronous SQLite engine
# (the standard library's driver) with the kit's table, in a downstream's transaction.
USE_THE_FENCE = textwrap.dedent(
    """
    from sqlalchemy import create_engine
    from telegram_intake_kit import FenceToken, Identity
    from telegram_intake_kit.fence import admit_sync, create_fence_sync

    engine = create_engine("sqlite://")
    token = FenceToken(Identity(bot="shop", update_id=7, attempt=2, claim_id="c-2"), 1)
    with engine.begin() as connection:
        create_fence_sync(connection)
        assert admit_sync(connection, token)
        older = FenceToken(Identity(bot="shop", update_id=7, attempt=1, claim_id="c-1"), 1)
        assert not admit_sync(connection, older)
    loaded = [n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED)]
    assert not loaded, loaded
    print("fence ok")
    """
)


def _run(code: str, blocked: tuple[str, ...] = BLOCKED) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", blocker(blocked) + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_kit_works_without_the_services_dependencies() -> None:
    done = _run(USE_THE_KIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kit ok"


def test_the_fence_works_with_sqlalchemy_alone() -> None:
    done = _run(USE_THE_FENCE, tuple(name for name in BLOCKED if name != "sqlalchemy"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fence ok"


def test_the_blocker_stops_the_service_itself() -> None:
    # The control: were the blocker broken, the test above would prove nothing.
    done = _run("import app.main\n")
    assert done.returncode != 0
    assert "blocked for this test" in done.stderr
