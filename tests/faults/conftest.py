"""Fixtures of the fault-injection suite (the helpers live in faultkit.py, imported by name from the tests)."""

from faultkit import disks  # noqa: F401  (a fixture: pytest finds it here)
