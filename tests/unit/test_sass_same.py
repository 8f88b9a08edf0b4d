"""benchmarks/sass_same.py: the check that a cut unit's parts hold the whole unit's kernels with the same SASS."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def sass_same(monkeypatch):
    spec = importlib.util.spec_from_file_location("sass_same", ROOT / "benchmarks" / "sass_same.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    objects = {
        "whole.o": {"k1": "A", "k2": "B", "prep": "P"},
        "p1.o": {"k1": "A", "prep": "P"},
        "p2.o": {"k2": "B", "prep": "P"},
        "p2bad.o": {"k2": "B2", "prep": "P"},
        "p2dup.o": {"k2": "B", "prep": "Q"},
    }
    monkeypatch.setattr(mod, "kernels", lambda obj: objects[obj])
    return mod


def test_the_same_kernels_pass_even_when_two_parts_hold_one(sass_same, capsys) -> None:
    assert sass_same.main(["whole.o", "p1.o", "p2.o"]) == 0
    assert "in two parts: 1; different SASS: 0" in capsys.readouterr().out


@pytest.mark.parametrize("parts, why", [
    (["p1.o"], "only in the whole unit: 1"),
    (["p1.o", "p2bad.o"], "different SASS: 1"),
    (["p1.o", "p2dup.o"], "different SASS: 1"),  # a kernel in two parts, compiled differently
])
def test_a_missing_or_different_kernel_fails(sass_same, capsys, parts, why) -> None:
    assert sass_same.main(["whole.o", *parts]) == 1
    assert why in capsys.readouterr().out
