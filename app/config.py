"""Service settings: one pydantic-settings class, validated at start-up, `INTAKE_` environment."""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.store import validate
from app.store.engine import normalise_url
from app.store.schema import DEFAULT_TABLE

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/intake.db"


class Settings(BaseSettings):
    """Everything the service reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="INTAKE_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    table: str = DEFAULT_TABLE
    host: str = "127.0.0.1"
    port: int = 8080

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, value: str) -> str:
        return normalise_url(value).render_as_string(hide_password=False)

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        return validate.table_name(value)
