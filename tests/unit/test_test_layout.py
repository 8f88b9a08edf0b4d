"""The test tree: pytest imports test files by basename (no __init__.py), so two files may not share one."""

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_file_has_a_unique_basename():
    files = [*ROOT.joinpath("tests").rglob("test_*.py"), *ROOT.joinpath("kernels").rglob("tests/test_*.py")]
    counts = Counter(f.name for f in files if ".kforge" not in f.parts)
    assert not [name for name, n in counts.items() if n > 1]
