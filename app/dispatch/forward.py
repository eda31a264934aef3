"""Forwarding one attempt to the bot's own handler (SPEC section 6).

The body is the stored raw update, byte for byte. Headers carry the attempt's full identity
(`X-Intake-*`) and when the update was recorded (`X-Intake-Received-At`: with the attempt,
the fencing token of `app.kit.fence`), the downstream secret under Telegram's own header
name (so an unmodified aiogram, python-telegram-bot, grammY or Telegraf webhook handler
accepts the request), and a Standard Webhooks signature when the bot has a `signing_secret`:
`webhook-signature` over the body, `X-Intake-Identity-Signature` over the identity and the
recording time. A `plain` bot forwards the bare update: no identity, as a table at revision
0001 has none.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from app.config import BotSettings
from app.dispatch.transport import AiohttpTransport
from app.kit.forwarded import IDENTITY_SIGNATURE_HEADER, RECEIVED_AT_HEADER, identity_message
from app.policy import Outcome, classify, classify_error
from app.store import ClaimIdentity


class Downstream:
    """Where one bot's attempts go, and how they are addressed and signed."""

    def __init__(self, bot: BotSettings, transport: httpx.AsyncBaseTransport) -> None:
        if bot.downstream_url is None:
            raise ValueError(f"bot {bot.name!r} has no downstream_url")
        self.bot = bot
        self._transport = transport
        self._url = httpx.URL(str(bot.downstream_url))
        exhaustion_url = bot.exhaustion_url
        self._exhaustion_url = None if exhaustion_url is None else httpx.URL(str(exhaustion_url))
        # identity: httpx would inflate a compressed answer past the transport's size bound.
        self._plain_headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self._headers = dict(self._plain_headers)
        if bot.downstream_secret_token is not None:
            secret = bot.downstream_secret_token.get_secret_value()
            self._headers["x-telegram-bot-api-secret-token"] = secret
        self._signer = (
            None if bot.signing_secret is None else Webhook(bot.signing_secret.get_secret_value())
        )
        self._timeout = httpx.Timeout(bot.forward_timeout_seconds).as_dict()

    async def forward(
        self,
        identity: ClaimIdentity,
        body: str,
        lease_until: int,
        *,
        received_at: int | None = None,
    ) -> Outcome:
        """POST one attempt; what its answer means. Never raises for the downstream's sake.
        `received_at` is the recording's (the claimed row's); without it the request carries
        no fencing token."""
        headers = dict(self._headers)
        fenced = self.bot.mode != "plain"
        if fenced:
            headers["x-intake-bot"] = identity.bot
            headers["x-intake-update-id"] = str(identity.update_id)
            headers["x-intake-attempt"] = str(identity.attempt)
            headers["x-intake-claim-id"] = identity.claim_id
            headers["x-intake-lease-expires-at"] = str(lease_until)
            if received_at is not None:
                headers[RECEIVED_AT_HEADER] = str(received_at)
        timestamp = self._sign(headers, f"{identity.bot}:{identity.update_id}", body)
        if fenced and received_at is not None and self._signer is not None:
            signed = identity_message(identity, received_at)
            headers[IDENTITY_SIGNATURE_HEADER] = self._signer.sign(signed, timestamp, "")
        return await self._post(self._url, headers, body)

    async def deliver_exhaustion(self, identity: ClaimIdentity, payload: str) -> Outcome:
        """POST an exhaustion record to `exhaustion_url`, keyed for idempotency by the
        identity of the attempt that ended the update."""
        if self._exhaustion_url is None:
            raise ValueError(f"bot {self.bot.name!r} has no exhaustion_url")
        key = f"{identity.bot}:{identity.update_id}:{identity.attempt}:{identity.claim_id}"
        headers = {**self._plain_headers, "idempotency-key": key}
        self._sign(headers, f"exhaustion:{key}", payload)
        return await self._post(self._exhaustion_url, headers, payload)

    def _sign(self, headers: dict[str, str], message_id: str, body: str) -> datetime:
        """Sign the message when the bot has a signing secret; the timestamp either way."""
        return sign(self._signer, headers, message_id, body)

    async def _post(self, url: httpx.URL, headers: dict[str, str], body: str) -> Outcome:
        return await post(self._transport, url, headers, body, self._timeout)


def sign(signer: Webhook | None, headers: dict[str, str], message_id: str, body: str) -> datetime:
    """Add the Standard Webhooks headers of `body` (as `message_id`) when there is a signer;
    the timestamp signed, or now."""
    timestamp = datetime.now(tz=UTC)
    if signer is not None:
        headers["webhook-id"] = message_id
        headers["webhook-timestamp"] = str(int(timestamp.timestamp()))
        headers["webhook-signature"] = signer.sign(message_id, timestamp, body)
    return timestamp


async def post(
    transport: httpx.AsyncBaseTransport,
    url: httpx.URL,
    headers: dict[str, str],
    body: str,
    limits: dict[str, float | None],
) -> Outcome:
    """POST `body` within `limits` (httpx's timeouts, as a dict); what the answer means
    (`app.policy`). Never raises for the receiver's sake: a failure is an Outcome too."""
    # httpx's Request and Response, sent by the transport itself: AsyncClient's machinery
    # (auth, redirects, cookies, hooks) is all unused here, and through it a request took
    # 1.6 times the instructions (valgrind; bench client shows the rates).
    request = httpx.Request(
        "POST", url, headers=headers, content=body.encode(), extensions={"timeout": limits}
    )
    try:
        response = await transport.handle_async_request(request)
    except httpx.HTTPError as error:
        return classify_error(error)
    try:
        if not 200 <= response.status_code < 300:  # the body only explains a failure
            await response.aread()
    except httpx.HTTPError as error:
        return classify_error(error)
    finally:
        await response.aclose()
    return classify(response)


def open_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    """What forwards: httpx's transport interface over aiohttp (`AiohttpTransport`), since
    httpx's own transport caps a process at a few hundred requests/s under concurrency
    (encode/httpx#3215). It follows no redirects and keeps no cookies."""
    return AiohttpTransport(max_connections=max_connections)
