"""Erasure on request over HTTP (docs/privacy.md, docs/contract.md section 17).

`POST /v1/erasures` records a durable job and answers 202 with it at once: the workers take it
within a second and work it in bounded batches; `GET /v1/erasures/{id}` tells its state and
counts, never the id it erases. Both need an `operator` key allowed the job's bot; a job of
another bot is 404 to a key that may not see it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path
from pydantic import Field, StrictBool, StrictInt, model_validator

from app.api.deps import REFUSALS, Operator, StrictJsonRoute
from app.store.operator_types import Erasure
from telegram_intake_kit.wire import MAX_BIGINT, BotName, EpochMillis, Message, Problem

router = APIRouter(
    route_class=StrictJsonRoute,
    prefix="/v1",
    tags=["personal data"],
    responses={**REFUSALS, 404: {"model": Problem, "description": "no such erasure"}},
)

TelegramId = Annotated[StrictInt, Field(ge=-(2**63) + 1, le=2**63 - 1, examples=[123456789])]


class ErasureRequest(Message):
    """Erase every stored copy of the updates of `bot` that name a user or a chat, in any
    role; exactly one of `user_id` and `chat_id` (a private chat's id is its user's)."""

    bot: BotName
    user_id: TelegramId | None = None
    chat_id: TelegramId | None = None
    dry_run: StrictBool = False

    @model_validator(mode="after")
    def _one_subject(self) -> ErasureRequest:
        if (self.user_id is None) == (self.chat_id is None):
            raise ValueError("give exactly one of user_id and chat_id")
        return self


class ErasureView(Message):
    id: Annotated[StrictInt, Field(ge=1, le=MAX_BIGINT)]
    bot: BotName
    kind: Literal["user", "chat", "bot"]
    dry_run: bool
    state: Literal["pending", "running", "done"]
    requested_at: EpochMillis
    requested_by: str
    finished_at: EpochMillis | None
    updates: int = Field(description="updates erased so far (a dry run: that it would erase)")
    attempts: int = Field(description="their attempts in the history")
    events: int = Field(description="their operational events")

    @classmethod
    def of(cls, erasure: Erasure) -> ErasureView:
        return cls.model_validate(erasure, from_attributes=True)


@router.post("/erasures", status_code=202)
async def request_erasure(request: ErasureRequest, grant: Operator) -> ErasureView:
    """Record an erasure job; the workers run it. Nothing is delivered of those updates once
    their rows are erased, and an attempt that holds one loses its claim (`owns` is false)."""
    grant.whole_bots()  # a user's data across every destination of the bot
    grant.allow(request.bot)
    kind: Literal["user", "chat"] = "user" if request.user_id is not None else "chat"
    subject = request.user_id if request.user_id is not None else request.chat_id
    services = grant.services
    erasure_id = await services.store.request_erasure(
        request.bot,
        kind=kind,
        subject=subject,
        at=services.now(),
        by=grant.key.label,
        dry_run=request.dry_run,
    )
    erasure = await services.store.get_erasure(erasure_id)
    assert erasure is not None
    return ErasureView.of(erasure)


@router.get("/erasures/{erasure_id}")
async def get_erasure(
    erasure_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)], grant: Operator
) -> ErasureView:
    """An erasure job as it stands: its state and counts."""
    grant.whole_bots()
    erasure = await grant.services.store.get_erasure(erasure_id)
    if erasure is None or not grant.key.allows(erasure.bot):
        raise HTTPException(404, f"no erasure {erasure_id}")
    return ErasureView.of(erasure)
