"""The console on a real uvicorn server over fresh storage (the `/v1` API's fixtures: the same
app, bots and keys), with a browser-less client that signs in as a person would."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.api.conftest import Api, serving
from tests.conftest import Storage

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Console:
    """A signed-in client of the console: `get` a page, `act` on a form (its CSRF token read
    from the page it was on, as a browser would send it)."""

    def __init__(self, api: Api, client: httpx.AsyncClient) -> None:
        self.api = api
        self.http = client
        self.csrf = ""

    async def sign_in(self, key: str) -> httpx.Response:
        answer = await self.http.post("/console/sign-in", data={"key": key})
        if answer.status_code == 303:
            page = await self.get("/console")
            self.csrf = CSRF.search(page.text).group(1)  # type: ignore[union-attr]
        return answer

    async def get(self, path: str, **params: str) -> httpx.Response:
        # Empty params would replace a query the path already has (a link, a redirect).
        return await self.http.get(path, params=params or None)

    async def act(self, path: str, **fields: str) -> httpx.Response:
        return await self.http.post(path, data={"csrf": self.csrf, **fields})


@pytest.fixture
async def console(storage: Storage) -> AsyncIterator[Console]:
    """The console on each backend, a client not yet signed in."""
    async with (
        serving(storage.url()) as api,
        httpx.AsyncClient(base_url=api.base, timeout=30) as client,
    ):
        yield Console(api, client)
