"""What the metrics are named and labelled with (docs/operations.md lists each metric): the
name prefix, and the fixed sets of label values that `app.metrics` counts by and the parts of
the service report in.

Label values stay bounded: bots are the configured ones (an unknown bot's requests count under
`(unknown)`, rows of bots not configured here under `(other)`); results, outcomes and reasons are
the fixed sets below. Never an update id or a claim id.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "OTHER_BOTS",
    "PREFIX",
    "UNKNOWN_BOT",
    "AttemptOutcome",
    "CloseReason",
    "DeliveryResult",
    "ForwardAnswer",
    "IntakeResult",
    "LostReason",
    "PollResult",
    "Refusal",
    "RenewalResult",
    "WebhookCheck",
]

PREFIX = "telegram_intake_"
UNKNOWN_BOT = "(unknown)"  # never a bot name: those match ^[a-z0-9][a-z0-9_-]{0,31}$
OTHER_BOTS = "(other)"

IntakeResult = Literal[
    "accepted",  # recorded: 200 after the commit
    "duplicate",  # already recorded: 200, nothing changed
    "forbidden",  # unknown bot or wrong secret token: 403
    "source_refused",  # outside allowed_sources: 403
    "encoded",  # a Content-Encoding, which nothing here decodes: 415
    "too_large",  # 413
    "invalid",  # not a Telegram update: 400
    "disconnected",  # the client went away before its body was read: 400
    "unavailable",  # no commit confirmed in time: 503, Telegram delivers it again
    "failed",  # what nothing expected: 500 in fixed words with a request id
]
AttemptOutcome = Literal[
    "completed",  # 2xx, settled completed
    "deferred",  # 202: the downstream settles it through /v1/claims
    "retry",  # settled failed, due again after backoff
    "terminal",  # a 4xx that is not retried: exhausted (durable) or abandoned
    "spent",  # a retryable answer to the last allowed attempt: ended as terminal is
    "expired",  # past its update type's deadline: ended as terminal is
    "lost",  # owner lost: the claim was taken or lapsed; nothing written
    "handed_back",  # the worker stopped mid-request: made due again at once
    "unsettled",  # the database timed the settle out past the lease: redelivered then
]
# What a forward got back (`app.policy.Outcome.answer`): its status's class, or why none came.
ForwardAnswer = Literal["2xx", "3xx", "4xx", "5xx", "timeout", "connection_error", "other"]
RenewalResult = Literal["renewed", "refused", "failed"]
LostReason = Literal["renewal_refused", "lease_ran_out", "settle_refused", "exhaust_refused"]
DeliveryResult = Literal["delivered", "failed"]
WebhookCheck = Literal["checked", "failed"]  # a getWebhookInfo call answered, or not
# A getUpdates call's result (app.intake.polling): answered, 409 (a webhook is set, or another
# poller runs elsewhere), 429, 401 (the token is refused: polling stops), anything else.
PollResult = Literal["ok", "conflict", "rate_limited", "unauthorized", "failed"]
# Why the server closed a client connection (app.http.server), and what the request guard
# refused before any route ran (app.http.guard).
CloseReason = Literal["header_timeout", "body_timeout", "keep_alive", "header_too_large", "evicted"]
Refusal = Literal["duplicate_header", "unauthenticated", "throttled", "encoding", "too_large"]
