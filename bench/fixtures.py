"""What the process benchmarks share (`dispatch`, `api`, `pipeline`, the soak): fresh schemas of
the bench database, the environment of a `serve` or `worker` child, and the updates they post.
Only the project's own dependencies: the soak's short run is part of the test command."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

import psycopg

from bench.child import Child, process
from bench.store import POSTGRES_URL

SECRET = "bench-secret_token"  # noqa: S105 - a fixed test secret
BOT = "default"  # the bot that a bare INTAKE_SECRET_TOKEN makes
CHATS = 500


def body(update_id: int) -> str:
    chat = 1_000_000 + update_id % CHATS
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 1_700_000_000,
                "chat": {"id": chat, "type": "private"},
                "from": {"id": chat, "is_bot": False, "first_name": "Bench"},
                "text": f"update {update_id}",
            },
        }
    )


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[tuple[str, str]]:
    """A new PostgreSQL schema: (SQLAlchemy URL with search_path, schema name)."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(POSTGRES_URL, autocommit=True)
    admin.execute(f"CREATE SCHEMA {name}")
    url = POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{url}?options=-csearch_path%3D{name}", name
    finally:
        admin.execute(f"DROP SCHEMA {name} CASCADE")
        admin.close()


def worker_env(database_url: str, downstream: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
    env.update(
        INTAKE_DATABASE_URL=database_url,
        INTAKE_SECRET_TOKEN=SECRET,
        INTAKE_DOWNSTREAM_URL=f"{downstream}/hook",
        **extra,
    )
    return env


def serve(env: dict[str, str], command: str = "serve") -> AbstractAsyncContextManager[Child]:
    """A `telegram-intake serve` (or `run`) child with `env`, yielded once uvicorn listens."""
    argv = (sys.executable, "-m", "app.cli", command)
    return process(*argv, env=env, ready="Uvicorn running", label=command)


def worker(env: dict[str, str]) -> AbstractAsyncContextManager[Child]:
    """A `telegram-intake worker` child with `env`, yielded once its workers started."""
    command = (sys.executable, "-m", "app.cli", "worker")
    return process(*command, env=env, ready="worker started", label="worker")


async def start_path(
    stack: AsyncExitStack, env: dict[str, str], downstream: Sequence[str], workers: int
) -> dict[str, Child]:
    """The whole path's processes, each stopped with `stack`: the `downstream` command, one
    `serve` and `workers` worker processes, by name."""
    children = {"downstream": await stack.enter_async_context(process(*downstream, ready="ready"))}
    children["serve"] = await stack.enter_async_context(serve(env))
    for n in range(workers):
        children[f"worker {n + 1}"] = await stack.enter_async_context(worker(env))
    return children
