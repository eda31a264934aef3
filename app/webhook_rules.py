"""What Telegram's Bot API server accepts in setWebhook (tdlib/telegram-bot-api, Client.cpp and
WebhookActor.cpp at 01a3679): the secret token's shape, max_connections by server, the names of
allowed_updates, the certificate's size. The settings check a bot's values by these at start-up,
and `set-webhook` checks what it sends by them (`app.cli.webhook_checks` adds the URL's).
"""

from __future__ import annotations

import difflib
import re

from pydantic import AnyHttpUrl, SecretStr

from app.queues import QUEUES, unknown_update_types

# What setWebhook accepts as secret_token: 1-256 of A-Z, a-z, 0-9, _ and -.
SECRET_TOKEN_PATTERN = r"^[A-Za-z0-9_-]{1,256}$"  # noqa: S105 - a shape, not a secret
# Telegram's own Bot API server. Any other bot_api_url is taken for a local Bot API server
# (telegram-bot-api --local), which setWebhook allows more: max_connections up to 100000,
# http:// and any port, any valid ip_address (Client.cpp and WebhookActor.cpp at 01a3679).
OFFICIAL_BOT_API_URL = "https://api.telegram.org"
OFFICIAL_BOT_API_HOST = "api.telegram.org"
MAX_CONNECTIONS_OFFICIAL = 100
MAX_CONNECTIONS_LOCAL = 100_000
MAX_CERTIFICATE_BYTES = 3 << 20  # setWebhook's certificate (Client.h, MAX_CERTIFICATE_FILE_SIZE)


def is_local_bot_api(url: AnyHttpUrl) -> bool:
    """Whether `url` (a bot_api_url) is a local Bot API server: any host but api.telegram.org."""
    return (url.host or "").rstrip(".").lower() != OFFICIAL_BOT_API_HOST


def update_types_problem(names: tuple[str, ...] | list[str]) -> str | None:
    """What is wrong with `names` as setWebhook's allowed_updates, in words, or None: each name
    that is not an update type of the Bot API (app.queues.QUEUES), with the closest one."""
    unknown = unknown_update_types(names)
    if not unknown:
        return None
    named = []
    for name in dict.fromkeys(unknown):
        close = difflib.get_close_matches(name.lower(), QUEUES, n=1)
        named.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return (
        f"not update types of the Bot API: {', '.join(named)}; "
        f"the update types are {', '.join(QUEUES)} (Telegram ignores any other name)"
    )


def max_connections_problem(value: int, local: bool) -> str | None:
    """What is wrong with `value` as setWebhook's max_connections, or None: 1-100 with
    Telegram's server, 1-100000 with a local Bot API server."""
    if local and not 1 <= value <= MAX_CONNECTIONS_LOCAL:
        return f"{value} is not 1-{MAX_CONNECTIONS_LOCAL}, what a local Bot API server takes"
    if not local and not 1 <= value <= MAX_CONNECTIONS_OFFICIAL:
        return (
            f"{value} is not 1-{MAX_CONNECTIONS_OFFICIAL}, what Telegram's Bot API server "
            f"({OFFICIAL_BOT_API_URL}) takes; up to {MAX_CONNECTIONS_LOCAL} only with a local "
            "Bot API server as bot_api_url"
        )
    return None


def check_secret_token(value: SecretStr | None) -> SecretStr | None:
    """`value` unless it is not what setWebhook takes as secret_token (a validator's check)."""
    if value is not None and not re.fullmatch(SECRET_TOKEN_PATTERN, value.get_secret_value()):
        raise ValueError("must be 1-256 characters of A-Z, a-z, 0-9, _ and - (as setWebhook)")
    return value
