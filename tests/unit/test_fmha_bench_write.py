"""benchmarks/fmha_vs_sdpa.py --write: only the generated table between its two marker lines is
replaced, the text written under the section by hand (the tuning record) and the other sections
stay, and a section without the markers is refused with the file left as it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the benchmark script needs torch")
pytest.importorskip("kforge_fmha", reason="the benchmark script imports kforge_fmha")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("fmha_vs_sdpa", ROOT / "benchmarks" / "fmha_vs_sdpa.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _section(mod, body: str) -> str:
    return "\n".join([mod.HEADING, "", mod.BEGIN, "", body, "", mod.END, ""])


def test_only_the_marked_table_is_replaced(bench, tmp_path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## build jobs\n\nkept 1\n\n"
                   + _section(bench, "| old table |")
                   + "\nReading the table: kept 2\n\n**Tuning run 29**: kept 3\n\n## arch enforcement\n\nkept 4\n")
    bench.write_section(doc, _section(bench, "| new table |"))
    text = doc.read_text()
    assert "| new table |" in text and "| old table |" not in text
    for kept in ("kept 1", "kept 2", "kept 3", "kept 4", "## arch enforcement"):
        assert kept in text
    assert text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1


def test_a_section_without_markers_is_refused_and_left_alone(bench, tmp_path) -> None:
    doc = tmp_path / "benchmarks.md"
    before = f"# Benchmarks\n\n{bench.HEADING}\n\n| old table |\n\nhand-written record\n"
    doc.write_text(before)
    with pytest.raises(bench.WriteRefused, match="would lose that text. Nothing was written"):
        bench.write_section(doc, _section(bench, "| new table |"))
    assert doc.read_text() == before


def test_a_file_without_the_section_gets_it_appended(bench, tmp_path) -> None:
    doc = tmp_path / "other.md"
    doc.write_text("# Notes\n\nsomething\n")
    bench.write_section(doc, _section(bench, "| table |"))
    text = doc.read_text()
    assert text.startswith("# Notes\n\nsomething\n") and "| table |" in text
    new = tmp_path / "new.md"
    bench.write_section(new, _section(bench, "| table |"))
    assert bench.HEADING in new.read_text()


def test_the_repositorys_benchmarks_md_keeps_its_tuning_record(bench, tmp_path) -> None:
    """The documented command (--write docs/benchmarks.md) on a copy of the real file: the table
    is replaced, every line outside the markers is kept."""
    real = (ROOT / "docs" / "benchmarks.md").read_text()
    doc = tmp_path / "benchmarks.md"
    doc.write_text(real)
    bench.write_section(doc, _section(bench, "| fresh table |"))
    text = doc.read_text()
    outside = real[:real.index(bench.BEGIN)] + real[real.index(bench.END) + len(bench.END):]
    assert text[:text.index(bench.BEGIN)] + text[text.index(bench.END) + len(bench.END):] == outside
    assert "| fresh table |" in text and "TMA tuning runs 22-30" in text
