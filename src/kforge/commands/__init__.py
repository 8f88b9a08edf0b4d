"""Subcommands of the ``kforge`` CLI: one module each, each with ``register(subparsers)``."""
