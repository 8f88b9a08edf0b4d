"""kforge.build.ninjaorder: parsing build.ninja into statements, longest-first reordering, the shim's argument reading."""

from __future__ import annotations

import pytest

from kforge.build import ninjaorder
from kforge.build.ninjaorder import UnitTimes, parse, reorder

TORCH_LIKE = """ninja_required_version = 1.3
cxx = c++
cuda_cflags = -O3

rule cuda_compile
  depfile = $out.d
  deps = gcc
  command = $nvcc $cuda_cflags -c $in -o $out

build /t/build/temp/csrc/fwd.o: cuda_compile /t/csrc/fwd.cu
build /t/build/temp/csrc/bwd.o: cuda_compile /t/csrc/bwd.cu
build /t/build/temp/csrc/split.o: cuda_compile /t/csrc/split.cu
  extra = 1

build /t/build/temp/csrc/api.o: compile /t/csrc/api.cpp



default /t/build/temp/csrc/fwd.o /t/build/temp/csrc/bwd.o /t/build/temp/csrc/split.o /t/build/temp/csrc/api.o
"""


def _outputs(text: str) -> list[str]:
    return [b.output.rsplit("/", 1)[-1] for b in parse(text) if b.output]


def test_parse_round_trips_and_finds_outputs() -> None:
    blocks = parse(TORCH_LIKE)
    assert "".join(b.text for b in blocks) == TORCH_LIKE
    assert _outputs(TORCH_LIKE) == ["fwd.o", "bwd.o", "split.o", "api.o"]
    split = next(b for b in blocks if b.output and b.output.endswith("split.o"))
    assert "  extra = 1\n" in split.text  # a statement keeps its own bindings


def test_reorder_puts_the_longest_first_and_keeps_every_statement() -> None:
    times = {"csrc/fwd.o": 120.0, "csrc/bwd.o": 170.0, "csrc/split.o": 250.0, "csrc/api.o": 10.0}
    new, measured, moved = reorder(TORCH_LIKE, lambda out: times.get(ninjaorder.unit_key(out).split("/", 2)[-1]))
    assert _outputs(new) == ["split.o", "bwd.o", "fwd.o", "api.o"]
    assert (measured, moved) == (4, 2)  # fwd and split swapped places
    assert sorted(new.splitlines()) == sorted(TORCH_LIKE.splitlines())  # same lines, other order
    assert new.index("rule cuda_compile") < new.index("build ")  # rules and variables stay where they were
    assert new.rstrip().endswith("api.o")  # the default line stays last


def test_nothing_measured_leaves_the_file_byte_for_byte() -> None:
    assert reorder(TORCH_LIKE, lambda out: None) == (TORCH_LIKE, 0, 0)


def test_unmeasured_edges_count_as_the_median() -> None:
    times = {"fwd.o": 100.0, "split.o": 300.0, "api.o": 1.0}
    new, measured, _ = reorder(TORCH_LIKE, lambda out: times.get(out.rsplit("/", 1)[-1]))
    assert measured == 3
    assert _outputs(new) == ["split.o", "fwd.o", "bwd.o", "api.o"]  # bwd (unmeasured) at the median, after fwd (stable)


def test_edges_never_cross_a_variable_or_rule_line() -> None:
    text = ("build a.o: cc a.c\nbuild b.o: cc b.c\nflags = -O2\nbuild c.o: cc c.c\nbuild d.o: cc d.c\n")
    new, _, _ = reorder(text, {"a.o": 1, "b.o": 2, "c.o": 3, "d.o": 4}.get)
    assert _outputs(new) == ["b.o", "a.o", "d.o", "c.o"]
    assert new.splitlines()[2] == "flags = -O2"


def test_escapes_and_continuations() -> None:
    text = "build dir$ x/a$:b.o: cc $\n    dir$ x/a.c\nbuild z.o: cc z.c"
    blocks = parse(text)
    assert [b.output for b in blocks] == ["dir x/a:b.o", "z.o"]
    new, _, moved = reorder(text, {"dir x/a:b.o": 1.0, "z.o": 2.0}.get)
    assert moved == 2 and new == "build z.o: cc z.c\nbuild dir$ x/a$:b.o: cc $\n    dir$ x/a.c\n"


def test_unit_key_and_lookup_by_path_tail() -> None:
    assert ninjaorder.unit_key("/w/tree/build/temp.linux/csrc/flash_attn/src/f.o") == "csrc/flash_attn/src/f.o"
    times = UnitTimes({"csrc/flash_attn/src/f.o": 5.0, "x/one/k.o": 1.0, "x/two/k.o": 2.0})
    assert times.lookup("/other/tree/build/temp.x/csrc/flash_attn/src/f.o") == 5.0
    assert times.lookup("CMakeFiles/t.dir/flash_attn/src/f.o") == 5.0  # the longest unique tail
    assert times.lookup("/else/k.o") is None  # two units end in k.o: ambiguous, left at the median
    assert times.lookup("/else/two/k.o") == 2.0


@pytest.mark.parametrize(("args", "expected"), [
    (["-v", "-j", "16"], "./build.ninja"),
    (["-C", "out", "-j16"], "./out/build.ninja"),
    (["-Cout", "-f", "x.ninja"], "./out/x.ninja"),
    (["--version"], None),
    (["-t", "commands"], None),
    (["-tcompdb"], None),
])
def test_build_file_from_ninja_arguments(args: list[str], expected: str | None) -> None:
    assert ninjaorder.build_file(args) == expected


def test_main_without_configuration_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert ninjaorder.main([]) == 2
    assert "no configuration" in capsys.readouterr().err


def test_globs_order_unmeasured_units_by_kind() -> None:
    times = UnitTimes({"flash_fwd_split_*": 235.0, "flash_bwd_*": 97.0, "flash_fwd_*": 70.0, "x/y/exact.o": 1.0})
    assert times.lookup("/t/build/temp/csrc/flash_attn/src/flash_fwd_split_hdim64_fp16_sm80.o") == 235.0
    assert times.lookup("/t/src/flash_fwd_hdim64_fp16_sm80.o") == 70.0  # the first glob that matches wins
    assert times.lookup("/t/src/flash_bwd_hdim64_fp16_causal_sm80.o") == 97.0
    assert times.lookup("/t/x/y/exact.o") == 1.0 and times.lookup("/t/other.o") is None


def test_a_missing_or_corrupt_config_is_a_clear_error_not_a_traceback(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from kforge.build import ninjaorder

    assert ninjaorder.main([str(tmp_path / "missing.json"), "-j2"]) == 2
    (tmp_path / "torn.json").write_text('{"ninja": ')
    assert ninjaorder.main([str(tmp_path / "torn.json")]) == 2
    (tmp_path / "empty.json").write_text("{}")
    assert ninjaorder.main([str(tmp_path / "empty.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("cannot read its configuration") == 3 and "Traceback" not in err
