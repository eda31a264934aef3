"""Service settings: one pydantic-settings class, validated at start-up.

Sources, strongest first: `INTAKE_*` environment variables, then the TOML file named by
`INTAKE_CONFIG` (default `./intake.toml` when present), then the defaults below. The file holds
one `[[bots]]` table per bot; without it, one bot named `default` comes from the environment
(`INTAKE_SECRET_TOKEN`, `INTAKE_DOWNSTREAM_URL`, ...). Secrets are `SecretStr`: never printed.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import hmac
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from app.logs import LogFormat
from app.queues import QUEUES, unknown_update_types
from app.store import validate
from app.store.engine import normalise_url
from app.store.schema import DEFAULT_TABLE
from app.store.types import Capability, Ordering

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/intake.db"
DEFAULT_CONFIG_FILE = "intake.toml"
# Telegram's published webhook source ranges (core.telegram.org/bots/webhooks).
TELEGRAM_SOURCES = ("149.154.160.0/20", "91.108.4.0/22")
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

Mode = Literal["plain", "fenced", "durable"]
# Past these ages (seconds from receipt) a delivery can no longer help: Telegram has already
# given up on the answer (inline and callback queries) or on the payment step.
DEFAULT_DEADLINES = {
    "inline_query": 30.0,
    "callback_query": 150.0,
    "shipping_query": 10.0,
    "pre_checkout_query": 10.0,
}
Networks = Annotated[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...], NoDecode]
# `viewer` reads (GET routes, the console's pages); `operator` also acts (pause, redrive, park,
# acknowledge...); `operations` is what `operator` was called before operator control, kept.
Scope = Literal["callback", "viewer", "operator", "operations"]
# Long enough that guessing is hopeless, and free of what would split a list or a header.
API_KEY_PATTERN = r"^[A-Za-z0-9._~+/=-]{16,256}$"


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


def _check_secret_token(value: SecretStr | None) -> SecretStr | None:
    if value is not None and not re.fullmatch(SECRET_TOKEN_PATTERN, value.get_secret_value()):
        raise ValueError("must be 1-256 characters of A-Z, a-z, 0-9, _ and - (as setWebhook)")
    return value


class BotOptions(BaseModel):
    """What a bot may set beyond its name and secret; the environment sets them for the
    `default` bot, a `[[bots]]` table for each named bot."""

    bot_token: SecretStr | None = None
    downstream_url: AnyHttpUrl | None = None
    downstream_secret_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    exhaustion_url: AnyHttpUrl | None = None
    mode: Mode = "durable"
    max_attempts: int = Field(8, ge=1, le=1000)
    lease_seconds: float = Field(60, gt=0, le=86_400)
    ordering: Ordering = "chat"
    concurrency: int = Field(64, ge=1, le=10_000)  # this bot's attempts in flight, per process
    forward_timeout_seconds: float = Field(30, gt=0, le=3600)
    retry_base_seconds: float = Field(2, gt=0, le=86_400)
    retry_cap_seconds: float = Field(600, gt=0, le=7 * 86_400)
    retry_after_cap_seconds: float = Field(600, ge=0, le=7 * 86_400)
    # Update type -> seconds from receipt; merged over DEFAULT_DEADLINES, 0 turns one off.
    deadlines: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    breaker_failures: int = Field(5, ge=0, le=10_000)  # consecutive failures; 0: no breaker
    # What `set-webhook` registers with Telegram (None: none sent). allowed_updates: names
    # of app.queues.QUEUES; max_connections: 1-100, up to 100000 with a local Bot API server
    # (Settings checks it against bot_api_url).
    allowed_updates: tuple[str, ...] | None = None
    max_connections: int | None = Field(None, ge=1, le=MAX_CONNECTIONS_LOCAL)
    breaker_cooldown_seconds: float = Field(30, gt=0, le=86_400)
    # Where updates come from (SPEC section 11): Telegram's webhook, or getUpdates long polling
    # by one process of the cluster (needs bot_token), each batch recorded before it is
    # confirmed; the long poll's timeout and batch size are getUpdates' own.
    source: Literal["webhook", "polling"] = "webhook"
    poll_timeout_seconds: int = Field(25, ge=0, le=50)
    poll_limit: int = Field(100, ge=1, le=100)

    @field_validator("downstream_secret_token")
    @classmethod
    def _check_downstream_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return _check_secret_token(value)

    @field_validator("signing_secret")
    @classmethod
    def _check_signing_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return _check_whsec(value)

    @field_validator("allowed_updates")
    @classmethod
    def _check_allowed_updates(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        problem = None if value is None else update_types_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("deadlines")
    @classmethod
    def _merge_deadlines(cls, value: dict[str, float]) -> dict[str, float]:
        for update_type, seconds in value.items():
            if seconds < 0:
                raise ValueError(f"{update_type}: {seconds} is negative (0 turns it off)")
        return {**DEFAULT_DEADLINES, **value}

    @model_validator(mode="after")
    def _polling_has_a_token(self) -> BotOptions:
        if self.source == "polling" and self.bot_token is None:
            raise ValueError("source: polling calls getUpdates with the bot's bot_token; set it")
        return self

    @model_validator(mode="after")
    def _plain_has_no_chat_order(self) -> BotOptions:
        # The base store methods of a plain bot know no chats: only fenced and durable bots
        # keep per-chat order (the claim's NOT EXISTS over the ordering index).
        if self.mode == "plain" and self.ordering == "chat":
            if "ordering" in self.model_fields_set:
                raise ValueError(
                    'ordering "chat" needs mode fenced or durable; a plain bot delivers '
                    'with ordering "none"'
                )
            object.__setattr__(self, "ordering", "none")
        return self

    @property
    def capability(self) -> Capability:
        """The table capability this bot's mode needs (ADR 0256 decision 1)."""
        return "base" if self.mode == "plain" else self.mode

    def deadline_ms(self, update_type: str | None) -> int | None:
        """How long after receipt an update of this type is still worth delivering."""
        seconds = self.deadlines.get(update_type or "")
        return int(seconds * 1000) if seconds else None


class BotSettings(BotOptions):
    """One bot: how Telegram reaches it here, and where its updates go."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: str
    secret_token: SecretStr

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return validate.bot_name(value)

    @field_validator("secret_token")
    @classmethod
    def _check_secret(cls, value: SecretStr) -> SecretStr | None:
        return _check_secret_token(value)

    @property
    def needs(self) -> str:
        """What needs the table's capability, for `store.require`'s refusal."""
        return f"bot {self.name!r} in {self.mode} mode"


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

    def allows(self, bot: str) -> bool:
        return self.bots is None or bot in self.bots


class Settings(BaseSettings, BotOptions):
    """Everything the service reads from its environment and configuration file."""

    model_config = SettingsConfigDict(
        env_prefix="INTAKE_", extra="forbid", hide_input_in_errors=True
    )

    database_url: str = Field(DEFAULT_DATABASE_URL, repr=False)  # may hold a password
    # PostgreSQL: no statement of the service waits longer than these (0: no limit).
    statement_timeout_ms: int = Field(30_000, ge=0, le=3_600_000)
    lock_timeout_ms: int = Field(5_000, ge=0, le=3_600_000)
    # The URL is PgBouncer in transaction pooling mode: no prepared statements, no session
    # settings (the timeouts are the role's), LISTEN only through a direct URL.
    database_pgbouncer: bool = False
    # A direct (session) URL to the same database, for the wake-ups' LISTEN only; None: the
    # database URL, or polling behind PgBouncer.
    listen_database_url: str | None = Field(None, repr=False)  # may hold a password
    # Record every attempt in the attempt history (revision 0004), in the statements that
    # claim and settle; off saves those writes (bench dispatch measures what they cost).
    attempt_history: bool = True
    table: str = DEFAULT_TABLE
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    bot_api_url: AnyHttpUrl = AnyHttpUrl("https://api.telegram.org")  # or a local Bot API server
    log_format: LogFormat = "auto"  # auto: text on a terminal, JSON otherwise
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    bots: tuple[BotSettings, ...] = ()
    # With no [[bots]], a secret token makes the `default` bot of this and BotOptions.
    secret_token: SecretStr | None = None

    # Bearer keys for /v1/*: INTAKE_API_KEYS="key1,key2" (full access), or [[api_keys]] tables
    # with `key`, `bots` and `scopes` in the file.
    api_keys: Annotated[tuple[ApiKey, ...], NoDecode] = ()

    # What any client that reaches the port may cost (app.http: docs/reliability.md).
    header_timeout_seconds: float = Field(10, gt=0, le=3600)  # connect -> end of the head
    body_timeout_seconds: float = Field(30, gt=0, le=3600)  # end of the head -> end of the body
    keep_alive_seconds: int = Field(5, ge=1, le=3600)  # silence after a response
    max_header_bytes: int = Field(16 << 10, ge=1024, le=1 << 20)  # request line and headers
    max_headers: int = Field(100, ge=8, le=1000)
    connection_limit: int = Field(4096, ge=16, le=1_000_000)  # open client connections
    api_max_body_bytes: int = Field(64 << 10, ge=1024, le=64 << 20)  # /v1 request bodies

    # Intake.
    max_body_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    allowed_sources: Networks = ()  # empty: any source; "telegram" names Telegram's ranges
    trusted_proxies: Networks = ()  # X-Forwarded-For is read only from these peers
    commit_batch_max: int = Field(500, ge=1, le=10_000)
    commit_wait_ms: float = Field(0, ge=0, le=1_000)
    commit_timeout_ms: float = Field(5_000, gt=0, le=120_000)  # per request, from its arrival
    # Bodies the group commit may hold (waiting, or in the insert in flight); past it, 503.
    commit_pending_max_bytes: int = Field(16 << 20, ge=1024, le=4 << 30)
    retry_after_seconds: int = Field(5, ge=1, le=3600)

    # Workers (`run` and `worker`), per process.
    worker_concurrency: int = Field(64, ge=1, le=10_000)  # attempts in flight, all bots
    worker_port: int | None = Field(None, ge=0, le=65535)  # `worker` serves /healthz, /metrics
    claim_batch: int = Field(64, ge=1, le=1_000)
    poll_interval_seconds: float = Field(1.0, gt=0, le=3600)
    shutdown_grace_seconds: float = Field(10, ge=0, le=3600)
    # A claim loop or lease keeper without a turn for this long fails /healthz (a restart helps).
    worker_stall_seconds: float = Field(120, gt=0, le=86_400)
    retention_seconds: float = Field(86_400, gt=0)  # completed and acknowledged rows kept
    prune_interval_seconds: float = Field(60, gt=0, le=86_400)
    exhaustion_retry_seconds: float = Field(30, gt=0, le=86_400)

    # The console (/console, SPEC section 10): its session cookies are signed by this secret;
    # without one, by a secret drawn from the API keys (so every process of one configuration
    # agrees, and changing the keys ends every session). It also names unnamed API keys in
    # the audit log (an HMAC of the key; without it, by their place in the list). A session
    # lasts this long from sign-in, and ends sooner after this long without a request.
    console_secret: SecretStr | None = None
    console_session_seconds: int = Field(8 * 3600, ge=60, le=30 * 86_400)
    console_idle_seconds: int = Field(30 * 60, ge=60, le=30 * 86_400)
    # Failed authentications (a wrong bearer key, a wrong key at the console's sign-in), per
    # source address and per process (app.http.throttle): this many at once, then one more
    # each auth_failure_seconds; past them the source is answered 429 until it waits.
    auth_failures_burst: int = Field(10, ge=1, le=10_000)
    auth_failure_seconds: float = Field(5, gt=0, le=3600)

    # Operational events (SPEC section 9; docs/operations.md): POSTed to operations_url, signed
    # with Standard Webhooks by operations_signing_secret (whsec_...), at least once: a failed
    # delivery is tried again after operations_retry_seconds, doubling up to an hour.
    operations_url: AnyHttpUrl | None = None
    operations_signing_secret: SecretStr | None = None
    operations_retry_seconds: float = Field(5, gt=0, le=3600)
    # backlog.stale: a bot's oldest undelivered update was received longer ago than this.
    stale_after_seconds: float = Field(300, gt=0, le=86_400 * 30)
    # Bots with a bot_token: getWebhookInfo once per this many seconds across the cluster
    # (pending_update_count and the last error as metrics; telegram.webhook_error); 0: never.
    webhook_check_seconds: float = Field(60, ge=0, le=86_400)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        named = os.environ.get("INTAKE_CONFIG")
        path = Path(named or DEFAULT_CONFIG_FILE)
        if named and not path.is_file():
            raise FileNotFoundError(f"INTAKE_CONFIG names {path}, which is not a file")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path.is_file():
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, value: str) -> str:
        return normalise_url(value).render_as_string(hide_password=False)

    @field_validator("listen_database_url")
    @classmethod
    def _normalise_listen_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = normalise_url(value)
        if url.get_backend_name() != "postgresql":
            raise ValueError("must be a postgresql URL: LISTEN is PostgreSQL's")
        return url.render_as_string(hide_password=False)

    @field_validator("operations_signing_secret")
    @classmethod
    def _check_operations_secret(cls, value: SecretStr | None) -> SecretStr | None:
        return _check_whsec(value)

    @model_validator(mode="after")
    def _operations_are_signed(self) -> Settings:
        if self.operations_url is not None and self.operations_signing_secret is None:
            raise ValueError(
                "operations_url: operational events are signed; set operations_signing_secret"
                " (whsec_ and base64 of at least 16 random bytes)"
            )
        return self

    @model_validator(mode="after")
    def _pgbouncer_is_postgresql(self) -> Settings:
        if self.database_pgbouncer and not self.database_url.startswith("postgresql"):
            raise ValueError("database_pgbouncer: the database URL is not PostgreSQL")
        return self

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        return validate.table_name(value)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_api_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            return tuple({"key": item} if isinstance(item, str) else item for item in value)
        return value

    @field_validator("allowed_sources", "trusted_proxies", mode="before")
    @classmethod
    def _parse_networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            expanded: list[Any] = []
            for item in value:
                expanded += TELEGRAM_SOURCES if item == "telegram" else [item]
            return tuple(ipaddress.ip_network(item, strict=False) for item in expanded)
        return value

    @model_validator(mode="after")
    def _pending_fits_a_body(self) -> Settings:
        if self.commit_pending_max_bytes < self.max_body_bytes:
            raise ValueError(
                f"commit_pending_max_bytes ({self.commit_pending_max_bytes}) is below "
                f"max_body_bytes ({self.max_body_bytes}): the largest update could never wait"
            )
        return self

    @model_validator(mode="after")
    def _default_bot(self) -> Settings:
        if not self.bots and self.secret_token is not None:
            options = {
                name: getattr(self, name)
                for name in BotOptions.model_fields
                if name in self.model_fields_set
            }
            default = BotSettings(name="default", secret_token=self.secret_token, **options)
            object.__setattr__(self, "bots", (default,))
        names = [bot.name for bot in self.bots]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"bots: names {duplicated} appear more than once")
        for index, api_key in enumerate(self.api_keys):
            unknown = sorted(set(api_key.bots or ()) - set(names))
            if unknown:
                raise ValueError(f"api_keys.{index}.bots: {unknown} are not configured bots")
        keys = [api_key.key.get_secret_value() for api_key in self.api_keys]
        if len(set(keys)) != len(keys):
            raise ValueError("api_keys: a key appears more than once")
        named = tuple(
            api_key.named(unnamed_label(api_key, index, self.console_secret))
            for index, api_key in enumerate(self.api_keys)
        )
        object.__setattr__(self, "api_keys", named)
        labels = [api_key.label for api_key in self.api_keys]
        if len(set(labels)) != len(labels):
            raise ValueError(
                "api_keys: a name appears more than once (the audit log tells keys by it)"
            )
        return self

    @model_validator(mode="after")
    def _max_connections_fit_the_bot_api(self) -> Settings:
        # Settings' own max_connections is bot `default`'s (from the environment).
        local = is_local_bot_api(self.bot_api_url)
        fields = [("max_connections", self.max_connections)]
        fields += [
            (f"bots.{index}.max_connections (bot {bot.name!r})", bot.max_connections)
            for index, bot in enumerate(self.bots)
        ]
        for field, value in fields:
            problem = None if value is None else max_connections_problem(value, local)
            if problem is not None:
                raise ValueError(f"{field}: {problem}")
        return self

    def store_options(self) -> dict[str, Any]:
        """`open_store`'s options, as these settings give them (not the URL)."""
        return {
            "table": self.table,
            "statement_timeout_ms": self.statement_timeout_ms,
            "lock_timeout_ms": self.lock_timeout_ms,
            "pgbouncer": self.database_pgbouncer,
            "listen_url": self.listen_database_url,
            "history": self.attempt_history,
            "events": self.operations_url is not None,
        }

    def bot(self, name: str) -> BotSettings | None:
        return next((bot for bot in self.bots if bot.name == name), None)


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


def _check_whsec(value: SecretStr | None) -> SecretStr | None:
    """A Standard Webhooks signing secret: whsec_ and base64 of at least 16 bytes."""
    if value is not None:
        secret = value.get_secret_value().removeprefix("whsec_")
        try:
            key = base64.b64decode(secret, validate=True)
        except binascii.Error:
            key = b""
        if len(key) < 16:
            raise ValueError("must be whsec_ and base64 of at least 16 random bytes")
    return value


def describe(error: ValidationError) -> str:
    """One line per invalid field, naming it, for a start-up failure message."""
    lines = []
    for problem in error.errors():
        field = ".".join(str(part) for part in problem["loc"]) or "settings"
        lines.append(f"{field}: {problem['msg']}")
    return "invalid configuration: " + "; ".join(lines)
