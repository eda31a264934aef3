"""The routes every process serves: /healthz, /readyz and /metrics. The service mounts them
beside the intake and the API; `telegram-intake worker` serves them alone on
INTAKE_WORKER_PORT. Each reads what it needs from `app.state`: settings, store, metrics.

/readyz answers anyone, but says only ready or not (docs/contract.md section 16): why it is not (a
bot Telegram refuses, the schema's revision, the database's error, a full disk while its episode
lasts: `app.store.storage`) and the schema's capability
are for a key with the viewer scope, which the request guard looks up when one is presented
(`app.http.guard`)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.deps import REFUSALS, Viewer
from app.api_keys import ApiKey
from app.http.keys import API_KEY_SCOPE
from app.metrics import CONTENT_TYPE, Metrics
from app.store import OperatorStore, SchemaError, StoreError
from app.store.errors import UPGRADE_HINT

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """The process is alive, and its workers (if it runs any) go round: 503 naming the loop
    that died or stalled, so an orchestrator restarts the process."""
    dispatcher = getattr(request.app.state, "dispatcher", None)
    problems: list[str] = [] if dispatcher is None else dispatcher.problems()
    if problems:
        return JSONResponse({"status": "unhealthy", "problems": problems}, 503)
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """The database answers and its schema serves every configured bot's mode: 200
    `{"status": "ready"}` or 503 `{"status": "unavailable"}`; with a viewer key, the schema's
    capability or what is wrong as well."""
    key: ApiKey | None = request.scope.get(API_KEY_SCOPE)
    details = await _readiness(request, key)
    status = 200 if details["status"] == "ready" else 503
    if key is None or not key.may("viewer"):
        return JSONResponse({"status": details["status"]}, status)
    return JSONResponse(details, status)


async def _readiness(request: Request, key: ApiKey | None) -> dict[str, str]:
    """Ready or not, and why, as `key` may read it: no table or driver text, and of a stopped
    poller only its bots' (another bot's makes the process unavailable without being named)."""
    store: OperatorStore = request.app.state.store
    full = store.storage.episode
    # A full disk, in the database's words (it may also have stopped the server: its WAL).
    storage = "" if full is None else f"{full.cause} (since {_iso(full.began_at)})"
    try:
        await store.ping()
        request.app.state.settings.check_schema(store)
    except SchemaError:
        problem = f"the database schema is below what the bots need; {UPGRADE_HINT}"
        return {"status": "unavailable", "error": problem}
    except (StoreError, OSError) as error:
        problem = f"database unreachable ({type(error).__name__})"
        return {"status": "unavailable", "error": "; ".join(filter(None, [storage, problem]))}
    if storage:
        return {"status": "unavailable", "error": storage}
    dispatcher = getattr(request.app.state, "dispatcher", None)
    stopped = {} if dispatcher is None else dispatcher.stopped_sources()
    if stopped:  # a bot whose poller cannot run (Telegram refuses its token)
        told = [why for bot, why in stopped.items() if key is not None and key.allows(bot)]
        return {"status": "unavailable", "error": "; ".join(told) or "a bot cannot take updates"}
    return {"status": "ready", "capability": store.capability}


def _iso(at: int) -> str:
    """Epoch ms as ISO 8601, UTC, to the second."""
    return datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"},
        **{status: REFUSALS[status] for status in (401, 403)},
    },
)
async def metrics_text(request: Request, grant: Viewer) -> Response:
    """Prometheus metrics (docs/operations.md), for a key with the `operations` scope;
    a key limited to some bots sees only their series. Database errors never fail it:
    `telegram_intake_database_up` is 0 instead."""
    grant.whole_bots()  # its series are the bots' as a whole, not one service's
    metrics: Metrics = request.app.state.metrics
    body = await metrics.exposition(grant.bots(None))
    return Response(body, media_type=CONTENT_TYPE)
