"""Service settings: one pydantic-settings class, validated at start-up.

Sources, strongest first: `INTAKE_*` environment variables, then the TOML file named by
`INTAKE_CONFIG` (default `./intake.toml` when present), then the defaults below. The file holds
one `[[bots]]` table per bot; without it, one bot named `default` comes from the environment
(`INTAKE_SECRET_TOKEN`, `INTAKE_DOWNSTREAM_URL`, ...). Secrets are `SecretStr`: never printed.

A bot's own settings are `app.bot_settings`, an API key's `app.api_keys`, and what Telegram's
setWebhook accepts, which both check by, `app.webhook_rules`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    Field,
    PrivateAttr,
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

from app.api_keys import ApiKey, check_limits, unnamed_label
from app.bot_settings import BotOptions, BotSettings, check_signing_secret
from app.logs import LogFormat
from app.privacy.keyfiles import read_own_ring
from app.privacy.keyring import (
    KeyRing,
    KeyRingError,
    parse_index_key,
    parse_keys,
    read_secret_file,
)
from app.store import validate
from app.store.codec import Codec
from app.store.engine import normalise_url
from app.store.lifecycle import Lifecycle
from app.store.schema import DEFAULT_TABLE
from app.webhook_rules import is_local_bot_api, max_connections_problem

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/intake.db"
DEFAULT_CONFIG_FILE = "intake.toml"
# Telegram's published webhook source ranges (core.telegram.org/bots/webhooks).
TELEGRAM_SOURCES = ("149.154.160.0/20", "91.108.4.0/22")
Networks = Annotated[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...], NoDecode]


class Settings(BaseSettings, BotOptions):
    """Everything the service reads from its environment and configuration file."""

    model_config = SettingsConfigDict(
        env_prefix="INTAKE_", extra="forbid", hide_input_in_errors=True
    )

    database_url: str = Field(DEFAULT_DATABASE_URL, repr=False)  # may hold a password
    # PostgreSQL: no statement of the service waits longer than these (0: no limit).
    statement_timeout_ms: int = Field(30_000, ge=0, le=3_600_000)
    lock_timeout_ms: int = Field(5_000, ge=0, le=3_600_000)
    # At start, `serve`, `run` and `worker` wait this long for an unavailable database (a
    # failover's gap, a database still starting) before they give up and exit.
    database_wait_seconds: float = Field(60, ge=0, le=3600)
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
    worker_concurrency: int = Field(64, ge=1, le=10_000)  # requests in flight, all bots
    worker_port: int | None = Field(None, ge=0, le=65535)  # `worker` serves /healthz, /metrics
    claim_batch: int = Field(64, ge=1, le=1_000)
    poll_interval_seconds: float = Field(1.0, gt=0, le=3600)
    shutdown_grace_seconds: float = Field(10, ge=0, le=3600)
    # A claim loop or lease keeper without a turn for this long fails /healthz (a restart helps).
    worker_stall_seconds: float = Field(120, gt=0, le=86_400)
    retention_seconds: float = Field(86_400, gt=0)  # completed and acknowledged rows kept
    prune_interval_seconds: float = Field(60, gt=0, le=86_400)
    exhaustion_retry_seconds: float = Field(30, gt=0, le=86_400)

    # The console (/console, docs/contract.md section 10): its session cookies are signed by this
    # secret; without one, by a secret drawn from the API keys (so every process of one
    # configuration agrees, and changing the keys ends every session). It also names unnamed API
    # keys in the audit log (an HMAC of the key; without it, by their place in the list). A session
    # lasts this long from sign-in, and ends sooner after this long without a request.
    console_secret: SecretStr | None = None
    console_session_seconds: int = Field(8 * 3600, ge=60, le=30 * 86_400)
    console_idle_seconds: int = Field(30 * 60, ge=60, le=30 * 86_400)
    # Failed authentications (a wrong bearer key, a wrong key at the console's sign-in), per
    # source address and per process (app.http.throttle): this many at once, then one more
    # each auth_failure_seconds; past them the source is answered 429 until it waits.
    auth_failures_burst: int = Field(10, ge=1, le=10_000)
    auth_failure_seconds: float = Field(5, gt=0, le=3600)

    # Operational events (docs/contract.md section 9; docs/operations.md): POSTed to
    # operations_url, signed with Standard Webhooks by operations_signing_secret (whsec_...), at
    # least once: a failed delivery is tried again after operations_retry_seconds, doubling up to
    # an hour.
    operations_url: AnyHttpUrl | None = None
    operations_signing_secret: SecretStr | None = None
    operations_retry_seconds: float = Field(5, gt=0, le=3600)
    # backlog.stale: a bot's oldest undelivered update was received longer ago than this.
    stale_after_seconds: float = Field(300, gt=0, le=86_400 * 30)
    # Bots with a bot_token: getWebhookInfo once per this many seconds across the cluster
    # (pending_update_count and the last error as metrics; telegram.webhook_error); 0: never.
    webhook_check_seconds: float = Field(60, ge=0, le=86_400)

    # Personal data at rest (docs/privacy.md, docs/contract.md section 17): the key ring, as
    # `id:base64,...` of 32-byte AES keys (the first encrypts, all decrypt), and the index key
    # (base64 of 32 bytes) that keys the digests of chat and user ids; each from a file instead
    # where the platform mounts its secrets as files. Without them, values are stored as they
    # are: `serve` and `worker` warn, `run` on SQLite makes a ring of its own, and
    # require_encryption refuses to start.
    encryption_keys: SecretStr | None = None
    encryption_keys_file: Path | None = None
    index_key: SecretStr | None = None
    index_key_file: Path | None = None
    require_encryption: bool = False
    _key_ring: KeyRing | None = PrivateAttr(None)

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
        return check_signing_secret(value)

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
        check_limits(self.api_keys, {bot.name: [t.name for t in bot.targets] for bot in self.bots})
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

    @model_validator(mode="after")
    def _load_key_ring(self) -> Settings:
        keys = _secret_or_file(self.encryption_keys, self.encryption_keys_file, "encryption_keys")
        index = _secret_or_file(self.index_key, self.index_key_file, "index_key")
        if keys is None and index is None:
            try:  # the ring `run` made for its own SQLite file, if it made one
                self._key_ring = read_own_ring(self.database_url)
            except KeyRingError as error:
                raise ValueError(str(error)) from None
            return self
        try:
            parsed = None if keys is None else parse_keys(keys)
            index_key = None if index is None else parse_index_key(index)
            if parsed is None:
                raise KeyRingError("index_key: set without encryption_keys, it would key nothing")
            if index_key is None:
                raise KeyRingError(
                    "index_key: required with encryption_keys (base64 of 32 random bytes, apart"
                    " from the encryption keys), to key the digests of chat and user ids"
                )
            self._key_ring = KeyRing(parsed, index_key)
        except KeyRingError as error:
            raise ValueError(str(error)) from None
        return self

    @property
    def key_ring(self) -> KeyRing | None:
        return self._key_ring

    @property
    def encryption_problem(self) -> str | None:
        """Why these settings store personal data as it is, in one line; None with a ring."""
        if self._key_ring is not None:
            return None
        return (
            "personal data is stored unencrypted: Telegram's Bot Developer Terms (4.4(a)) want "
            "it encrypted at rest; set INTAKE_ENCRYPTION_KEYS and INTAKE_INDEX_KEY "
            "(docs/privacy.md)"
        )

    def with_key_ring(self, ring: KeyRing) -> Settings:
        """These settings with `ring` (one `run` made for its own SQLite file)."""
        copied = self.model_copy()
        copied._key_ring = ring
        return copied

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
            "codec": Codec(self._key_ring),
        }

    def bot(self, name: str) -> BotSettings | None:
        return next((bot for bot in self.bots if bot.name == name), None)

    def check_schema(self, store: Lifecycle) -> None:
        """Refuse to serve a bot whose mode the live schema cannot carry: SchemaError naming
        the bot, its mode and `alembic upgrade head` (docs/design.md decision 1)."""
        for bot in self.bots:
            store.require(bot.capability, bot.needs)


def _secret_or_file(secret: SecretStr | None, path: Path | None, setting: str) -> str | None:
    if secret is not None and path is not None:
        raise ValueError(f"{setting}: set it or {setting}_file, not both")
    if path is not None:
        try:
            return read_secret_file(path, f"{setting}_file")
        except KeyRingError as error:
            raise ValueError(str(error)) from None
    return None if secret is None else secret.get_secret_value()


def describe(error: ValidationError) -> str:
    """One line per invalid field, naming it, for a start-up failure message."""
    lines = []
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in problem["loc"])
        # A check of the whole names its field in its own words.
        lines.append(f"{field}: {message}" if field else message)
    return "invalid configuration: " + "; ".join(lines)
