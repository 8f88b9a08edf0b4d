"""nox sessions for every target in forge.toml (`nox -l` lists them). Thin: kforge.sessions does the work."""

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # nox imports this file before kforge is installed anywhere

from kforge.sessions import register  # noqa: E402

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"  # register() switches to uv where uv is installed
nox.options.sessions = ["tests"]

register(nox, ROOT)
