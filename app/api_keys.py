"""The bearer keys of `/v1/*` and the console, as configured: `ApiKey`, with the bots and
scopes it is limited to and the name the audit log records it by (`app.http.keys` looks them
up)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from app.store import validate
from app.store.types import DEFAULT_DESTINATION

# `viewer` reads (GET routes, the console's pages); `operator` also acts (pause, redrive, park,
# acknowledge...); `operations` is what `operator` was called before operator control, kept.
Scope = Literal["callback", "viewer", "operator", "operations"]
# Long enough that guessing is hopeless, and free of what would split a list or a header.
API_KEY_PATTERN = r"^[A-Za-z0-9._~+/=-]{16,256}$"


class ApiKey(BaseModel):
    """A bearer key for `/v1/*`: every bot and every scope unless limited. `callback` covers
    what a downstream calls (owns, renew, settle, acknowledge); `viewer` reads the rest
    (exhaustions, updates, bots, stats, the audit log); `operator` (or its older name
    `operations`) also acts. `name` is what the audit log records (never the key); without
    one, a name is derived from a hash of the key."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    key: SecretStr
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}$")
    # The one scoping rule (docs/security.md): a key limited to some bots reads and acts on
    # theirs only, in every family of the API and the console. None: every bot.
    bots: tuple[str, ...] | None = None
    # A service's key (docs/destinations.md): its bots' deliveries to these destinations only,
    # read and settled; nothing of another destination, nor what belongs to the bot as a whole
    # (its pause, its audit log, its erasures). None: every destination.
    destinations: tuple[str, ...] | None = None
    scopes: tuple[Scope, ...] = ("callback", "operations")

    @property
    def label(self) -> str:
        """The key's name in the audit log and the console: never the key itself, nor
        anything from which it could be guessed offline. `Settings` names each unnamed key
        (`unnamed_label`); a key outside any settings is just "key"."""
        return self.name if self.name is not None else "key"

    def named(self, label: str) -> ApiKey:
        return self if self.name is not None else self.model_copy(update={"name": label})

    def may(self, scope: Scope) -> bool:
        """Whether this key holds `scope`: `operator` (or `operations`) includes `viewer`."""
        held = set(self.scopes)
        if held & {"operator", "operations"}:
            held |= {"operator", "operations", "viewer"}
        return scope in held

    @field_validator("key")
    @classmethod
    def _check_key(cls, value: SecretStr) -> SecretStr:
        if not re.fullmatch(API_KEY_PATTERN, value.get_secret_value()):
            raise ValueError("must be 16-256 characters of A-Z, a-z, 0-9 and ._~+/=-")
        return value

    @field_validator("bots")
    @classmethod
    def _check_bots(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(validate.bot_name(name) for name in value)

    @field_validator("destinations")
    @classmethod
    def _check_destinations(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("names no destination: leave it out to allow every one")
        return tuple(validate.destination_name(name) for name in value)

    def allows(self, bot: str, destination: str | None = None) -> bool:
        """Whether this key may see `bot` and, named, its deliveries to `destination`."""
        if self.bots is not None and bot not in self.bots:
            return False
        return destination is None or self.destinations is None or destination in self.destinations

    @property
    def whole_bots(self) -> bool:
        """Whether this key may see what belongs to a bot as a whole (not limited to
        destinations)."""
        return self.destinations is None


def unnamed_label(key: ApiKey, index: int, secret: SecretStr | None) -> str:
    """The audit log's name of an unnamed key: an HMAC of it under `secret` (stable while the
    secret is), else its place in the list ("key-1"). Never a plain hash of the key, which
    would let a reader of the audit log test guesses offline."""
    if secret is None:
        return f"key-{index + 1}"
    digest = hmac.new(
        secret.get_secret_value().encode(), key.key.get_secret_value().encode(), hashlib.sha256
    )
    return f"key-{digest.hexdigest()[:12]}"


def check_limits(keys: Sequence[ApiKey], destinations: Mapping[str, Sequence[str]]) -> None:
    """ValueError naming the first key limited to a bot that is not configured, or to a
    destination none of its bots has (`destinations`: each bot's destinations' names)."""
    for index, api_key in enumerate(keys):
        unknown = sorted(set(api_key.bots or ()) - set(destinations))
        if unknown:
            raise ValueError(f"api_keys.{index}.bots: {unknown} are not configured bots")
        reachable = {DEFAULT_DESTINATION}.union(
            *(names for bot, names in destinations.items() if api_key.allows(bot))
        )
        unknown = sorted(set(api_key.destinations or ()) - reachable)
        if unknown:
            raise ValueError(
                f"api_keys.{index}.destinations: {unknown} are not destinations of the key's bots"
            )
