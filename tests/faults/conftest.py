"""Fixtures of the fault-injection suite (the helpers live in faultkit.py, imported by name from the tests)."""

import signal

import pytest
from faultkit import disks  # noqa: F401  (a fixture: pytest finds it here)


@pytest.fixture(autouse=True, scope="session")
def _sigint_reaches_the_builds():
    """These tests interrupt kforge with SIGINT. A shell that starts a job in the background with
    ``&`` and no job control starts it with SIGINT ignored, and an ignored signal stays ignored in
    every child: the interrupted processes would then finish instead of stopping. Catching SIGINT
    here makes each child start with the default disposition again (``exec`` resets caught signals,
    not ignored ones), so the suite tests kforge, not how it was launched."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
