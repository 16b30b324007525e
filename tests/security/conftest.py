"""Mocked program tests here need a current event loop, as in tests/stacks (see tests/stacks/conftest.py)."""

from tests.stacks.conftest import current_event_loop

__all__ = ["current_event_loop"]
