"""docs/architecture.md cites only files that exist, and its module table names every module of src/kforge."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SRC = ROOT / "src" / "kforge"


def _files() -> list[str]:
    return [p.relative_to(ROOT).as_posix() for top in ("src", "tests", "benchmarks", "kernels", "scripts")
            for p in (ROOT / top).rglob("*.py") if ".kforge" not in p.parts] + [p.name for p in ROOT.glob("*.py")]


def test_every_python_file_the_page_names_exists() -> None:
    files = _files()
    named = set(re.findall(r"(?<![\w.-])([\w/]*\w\.py)\b", PAGE.read_text()))
    missing = sorted(n for n in named if not any(f == n or f.endswith("/" + n) for f in files))
    assert missing == []


def test_the_module_table_names_every_module() -> None:
    text = PAGE.read_text()
    table = text[text.index("\nsrc/kforge/\n"):text.index("\nkernels/fmha/ ")]
    modules = [p.relative_to(SRC) for p in SRC.rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") and p.parts[-2] != "commands"]
    unnamed = sorted(str(m) for m in modules if not re.search(rf"(?<![\w.]){re.escape(m.name)}\b", table))
    assert unnamed == []
