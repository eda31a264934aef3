"""The `/v1` API's fixtures (tests/api/conftest.py), for the guard's tests beside it."""

from tests.api.conftest import api, sqlite_api

__all__ = ["api", "sqlite_api"]
