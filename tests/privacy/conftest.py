"""The console's fixture, for the erasure's pages (tests/console/conftest.py)."""

from tests.console.conftest import console

__all__ = ["console"]
