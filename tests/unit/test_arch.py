"""kforge.cuda.arch: the table, parsing every spelling, and the toolchain support checks."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from packaging.version import Version

from kforge.cuda import arch as arch_mod
from kforge.cuda.arch import (
    KNOWN_ARCHS,
    Arch,
    Dropped,
    all_archs,
    as_cuda_version,
    code_kind,
    cuda_supports,
    filter_supported,
    host_arch,
    parse_arch,
    parse_arch_list,
    require_supported,
    supported_archs,
)
from kforge.errors import ArchError, ToolchainError

# `nvcc --list-gpu-arch` of /usr/local/cuda-13.0/bin/nvcc (release 13.0, V13.0.88) on the
# build machine, pasted verbatim (one name per line, this order, trailing newline).
NVCC_13_0_LIST_GPU_ARCH = (
    "compute_75\ncompute_80\ncompute_86\ncompute_87\ncompute_88\ncompute_89\ncompute_90\n"
    "compute_100\ncompute_110\ncompute_103\ncompute_120\ncompute_121\n"
)

# ------------------------------------------------------------------ the table, row by row

# number: (name contains, min CUDA, {variant: min CUDA}, max CUDA)
TABLE = {
    75: ("Turing", "10.0", {}, None),
    80: ("A100", "11.0", {}, None),
    86: ("Ampere", "11.1", {}, None),
    87: ("Orin", "11.4", {}, None),
    88: ("sm_88", "13.0", {}, None),
    89: ("Ada", "11.8", {}, None),
    90: ("Hopper", "11.8", {"a": "12.0"}, None),
    100: ("B200", "12.8", {"a": "12.8", "f": "12.9"}, None),
    101: ("Thor", "12.8", {"a": "12.8", "f": "12.9"}, "12.9"),
    103: ("B300", "12.9", {"a": "12.9", "f": "12.9"}, None),
    110: ("Thor", "13.0", {"a": "13.0", "f": "13.0"}, None),
    120: ("RTX 50xx", "12.8", {"a": "12.8", "f": "12.9"}, None),
    121: ("DGX Spark", "12.9", {"a": "12.9", "f": "12.9"}, None),
}


def test_table_has_exactly_the_expected_archs_in_order():
    assert list(KNOWN_ARCHS) == list(TABLE)


@pytest.mark.parametrize("number", list(TABLE))
def test_table_row(number):
    name, min_cuda, variants, max_cuda = TABLE[number]
    info = KNOWN_ARCHS[number]
    assert info.number == number
    assert name in info.name
    assert info.min_cuda == Version(min_cuda)
    assert info.variants == frozenset(variants)
    assert dict(info.min_cuda_variant) == {v: Version(c) for v, c in variants.items()}
    assert info.max_cuda == (Version(max_cuda) if max_cuda else None)
    # a variant never predates its base arch
    assert all(c >= info.min_cuda for c in info.min_cuda_variant.values())


def test_only_sm101_was_renamed_and_to_sm110():
    renamed = {n: i.renamed_to for n, i in KNOWN_ARCHS.items() if i.renamed_to}
    assert renamed == {101: 110}


def test_table_is_read_only():
    with pytest.raises(TypeError):
        KNOWN_ARCHS[70] = KNOWN_ARCHS[75]  # type: ignore[index]
    with pytest.raises(TypeError):
        KNOWN_ARCHS[90].min_cuda_variant["f"] = Version("12.9")  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "min_cuda"),
    [
        ("sm_90a", "12.0"), ("sm_90", "11.8"), ("sm_100a", "12.8"), ("sm_100f", "12.9"),
        ("sm_103a", "12.9"), ("sm_110", "13.0"), ("sm_110a", "13.0"), ("sm_110f", "13.0"),
        ("sm_120a", "12.8"), ("sm_120f", "12.9"), ("sm_121", "12.9"), ("sm_89", "11.8"),
        ("sm_86", "11.1"), ("sm_87", "11.4"), ("sm_75", "10.0"), ("sm_80", "11.0"), ("sm_88", "13.0"),
    ],
)
def test_min_cuda_per_arch_and_variant(text, min_cuda):
    assert parse_arch(text).min_cuda == Version(min_cuda)


def test_all_archs_lists_every_variant_once():
    names = [a.sm for a in all_archs()]
    assert len(names) == len(set(names))
    assert names[:8] == ["sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_90a"]
    assert {"sm_100f", "sm_101f", "sm_103f", "sm_110f", "sm_120f", "sm_121f"} <= set(names)
    assert not {"sm_90f", "sm_80a", "sm_75f"} & set(names)
    assert len(names) == 6 + 2 + 6 * 3  # 6 plain archs, sm_90 + sm_90a, 6 with a and f


# ------------------------------------------------------------------ the Arch value


def test_arch_properties():
    a = Arch(12, 0, "a")
    assert (a.suffixed, a.sm, a.compute, a.dotted, str(a)) == ("120a", "sm_120a", "compute_120a", "12.0a", "sm_120a")
    assert a.number == 120 and isinstance(a.number, int)
    assert a.base == Arch(12, 0)
    assert Arch(9, 0, "a", ptx=True).base == Arch(9, 0)
    assert a.with_variant("f") == Arch(12, 0, "f")
    assert a.with_variant("") == Arch(12, 0)
    assert a.info is KNOWN_ARCHS[120]
    assert Arch(10, 1).max_cuda == Version("12.9")


def test_arch_is_frozen_hashable_and_ordered():
    a = Arch(9, 0, "a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.major = 10  # type: ignore[misc]
    assert len({Arch(9, 0), Arch(9, 0), Arch(9, 0, "a")}) == 2
    assert sorted([Arch(12, 0), Arch(8, 0), Arch(9, 0, "a"), Arch(9, 0), Arch(10, 0)]) == [
        Arch(8, 0), Arch(9, 0), Arch(9, 0, "a"), Arch(10, 0), Arch(12, 0)
    ]


@pytest.mark.parametrize(
    ("args", "needle"),
    [((8, 0, "a"), "no 'a' variant"), ((9, 0, "f"), "no 'f' variant"), ((7, 0), "no longer supported"),
     ((9, 5), "unknown CUDA arch"), ((9, 0, "x"), "unknown variant")],
)
def test_arch_constructor_validates_against_the_table(args, needle):
    with pytest.raises(ArchError, match=needle):
        Arch(*args)


# ------------------------------------------------------------------ parsing

SPELLINGS = [
    ("sm120", Arch(12, 0)),
    ("sm_120", Arch(12, 0)),
    ("sm_120a", Arch(12, 0, "a")),
    ("SM_90A", Arch(9, 0, "a")),
    ("120", Arch(12, 0)),
    ("120a", Arch(12, 0, "a")),
    ("12.0", Arch(12, 0)),
    ("12.0a", Arch(12, 0, "a")),
    ("12.0f", Arch(12, 0, "f")),
    ("compute_90a", Arch(9, 0, "a")),
    ("9.0+PTX", Arch(9, 0, ptx=True)),
    ("sm90+ptx", Arch(9, 0, ptx=True)),
    (" 8.6 ", Arch(8, 6)),
    ("75", Arch(7, 5)),
    ("7.5", Arch(7, 5)),
    ("sm_121f", Arch(12, 1, "f")),
    ("10.3a", Arch(10, 3, "a")),
    ("sm_110f+PTX", Arch(11, 0, "f", ptx=True)),
    ("compute_88", Arch(8, 8)),
    ("sm_101a", Arch(10, 1, "a")),
    ("Sm-90a", Arch(9, 0, "a")),
]


@pytest.mark.parametrize(("text", "expected"), SPELLINGS, ids=[s for s, _ in SPELLINGS])
def test_parse_arch_spellings(text, expected):
    got = parse_arch(text)
    assert got == expected
    assert got.ptx == expected.ptx


@pytest.mark.parametrize("arch", all_archs(), ids=str)
def test_every_table_arch_round_trips_through_its_spellings(arch):
    for text in (arch.sm, arch.suffixed, arch.dotted, arch.compute, arch.sm.upper(), arch.dotted + "+PTX"):
        parsed = parse_arch(text)
        assert parsed.base == arch.base and parsed.variant == arch.variant


BAD_SPELLINGS = [
    # text, fragments the message must contain
    ("sm_95", ["unknown CUDA arch 'sm_95'", "did you mean 'sm_90'", "sm_75, sm_80"]),
    ("sm_1200", ["cannot read 'sm_1200'", "did you mean 'sm_120'"]),
    ("sm_12.0", ["cannot read 'sm_12.0'", "did you mean 'sm_120'"]),
    ("hopper", ["cannot read 'hopper'", "sm_90a, 90a, 9.0a"]),
    ("", ["cannot read ''"]),
    ("9", ["cannot read '9'", "did you mean '90'"]),
    ("sm_12x", ["unknown variant suffix 'x'", "'sm_120'"]),
    ("12.0b", ["unknown variant suffix 'b'"]),
    ("sm_90+sass", ["cannot read 'sm_90+sass'"]),
    ("80a", ["sm_80 has no 'a' variant", "exists as sm_80 only", "use sm_80"]),
    ("90f", ["sm_90 has no 'f' variant", "exists as sm_90, sm_90a", "use sm_90a"]),
    ("75f", ["sm_75 has no 'f' variant", "exists as sm_75 only"]),
    ("sm_89a", ["sm_89 has no 'a' variant"]),
    ("sm_70", ["sm_70", "no longer supported", "CUDA 13.0 dropped"]),
    ("6.1", ["sm_61", "CUDA 13.0 dropped"]),
    ("compute_35", ["sm_35", "CUDA 13.0 dropped"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD_SPELLINGS, ids=[t or "<empty>" for t, _ in BAD_SPELLINGS])
def test_parse_arch_rejects_with_a_helpful_message(text, fragments):
    with pytest.raises(ArchError) as exc:
        parse_arch(text)
    message = str(exc.value).lower()  # errors.py capitalises the why/fix sentences
    for fragment in fragments:
        assert fragment.lower() in message, (fragment, message)
    assert exc.value.exit_code == 3


def test_parse_arch_rejects_non_text():
    with pytest.raises(ArchError, match="must be text"):
        parse_arch(90)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("80;90a;120", ("sm_80", "sm_90a", "sm_120")),
        ("8.0 9.0a 12.0f", ("sm_80", "sm_90a", "sm_120f")),
        ("sm_80,sm_90a", ("sm_80", "sm_90a")),
        (["80", "9.0a", "sm_120"], ("sm_80", "sm_90a", "sm_120")),
        (["80;90", "100a 120"], ("sm_80", "sm_90", "sm_100a", "sm_120")),
        ("90;80;90;sm_90", ("sm_90", "sm_80")),
        (" 80 ;; 90a ,\n120 ", ("sm_80", "sm_90a", "sm_120")),
        ("90a;90", ("sm_90a", "sm_90")),
        ((), None),
    ],
)
def test_parse_arch_list(value, expected):
    if expected is None:
        with pytest.raises(ArchError, match="empty"):
            parse_arch_list(value)
        return
    assert tuple(a.sm for a in parse_arch_list(value)) == expected


def test_parse_arch_list_merges_ptx_into_the_first_occurrence():
    got = parse_arch_list("80;120;90;120+PTX")
    assert got == (Arch(8, 0), Arch(12, 0, ptx=True), Arch(9, 0))


def test_parse_arch_list_names_the_bad_entry():
    with pytest.raises(ArchError, match="'sm_91'"):
        parse_arch_list("80;sm_91;120")


@pytest.mark.parametrize(
    ("cap", "expected"),
    [((9, 0), Arch(9, 0)), ((12, 0), Arch(12, 0)), ((8, 9), Arch(8, 9)), ((10, 3), Arch(10, 3)), ((11, 0), Arch(11, 0))],
)
def test_host_arch_is_the_base_arch(cap, expected):
    got = host_arch(cap)
    assert got == expected and got.variant == "" and not got.ptx


def test_host_arch_of_a_dropped_gpu():
    with pytest.raises(ArchError, match="CUDA 13.0 dropped"):
        host_arch((7, 0))


# ------------------------------------------------------------------ CUDA versions and support


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.8", "12.8"), ("12.8.1", "12.8"), ("13", "13.0"), ("cu128", "12.8"), ("cu130", "13.0"),
     ("cu118", "11.8"), ("V13.0.88", "13.0"), (Version("12.9.1"), "12.9")],
)
def test_as_cuda_version(text, expected):
    assert as_cuda_version(text) == Version(expected)


def test_as_cuda_version_rejects_garbage():
    with pytest.raises(ToolchainError, match="'latest' is not a CUDA version"):
        as_cuda_version("latest")


@pytest.mark.parametrize(
    ("arch", "cuda", "ok"),
    [
        ("sm_90a", "12.0", True), ("sm_90a", "11.8", False), ("sm_90", "11.8", True), ("sm_90", "11.7", False),
        ("sm_100a", "12.8", True), ("sm_100f", "12.8", False), ("sm_100f", "12.9", True),
        ("sm_103a", "12.8", False), ("sm_103a", "12.9", True), ("sm_121", "12.8", False), ("sm_121", "12.9", True),
        ("sm_110", "12.9", False), ("sm_110f", "13.0", True), ("sm_88", "12.9", False), ("sm_88", "13.0", True),
        ("sm_101", "12.8", True), ("sm_101f", "12.9", True), ("sm_101", "13.0", False), ("sm_101a", "13.1", False),
        ("sm_120a", "12.8.1", True), ("sm_120f", "12.8.1", False), ("sm_75", "13.0", True),
    ],
)
def test_cuda_supports(arch, cuda, ok):
    assert cuda_supports(parse_arch(arch), cuda) is ok
    assert cuda_supports(parse_arch(arch), Version(cuda)) is ok


def test_cuda_supports_every_arch_from_its_own_min_cuda():
    for a in all_archs():
        assert cuda_supports(a, a.min_cuda)
        below = Version(f"{a.min_cuda.major}.{a.min_cuda.minor - 1}") if a.min_cuda.minor else Version(
            f"{a.min_cuda.major - 1}.9")
        assert not cuda_supports(a, below), a


def test_supported_archs_for_cuda_13_0_and_12_8():
    assert [a.number for a in supported_archs("13.0")] == [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]
    assert [a.number for a in supported_archs("12.8")] == [75, 80, 86, 87, 89, 90, 100, 101, 120]
    with_variants = {a.suffixed for a in supported_archs("12.8", variants=True)}
    assert {"90a", "100a", "101a", "120a"} <= with_variants
    assert not {"100f", "120f", "103a", "121a"} & with_variants


def test_require_supported_exact_message_for_sm103a_on_12_8():
    with pytest.raises(ToolchainError) as exc:
        require_supported(parse_arch_list("80;90a;103a;120f"), "12.8")
    err = exc.value
    assert err.what == "sm_103a needs CUDA 12.9 or newer, and the selected nvcc is CUDA 12.8"
    assert err.fix == ("install CUDA >= 12.9 and point CUDA_HOME at it (kforge provisions CUDA >= 13.0 from PyPI "
                       "with --cuda 13.0), or drop sm_103a from the arch list")
    assert err.exit_code == 4


def test_require_supported_names_the_source():
    with pytest.raises(ToolchainError, match="the selected pip nvcc is CUDA 12.8"):
        require_supported([Arch(12, 1)], "12.8", source="pip nvcc")


def test_require_supported_passes_when_everything_fits():
    require_supported(parse_arch_list("75;80;90a;100f;103a;110f;120f;121a"), "13.0")
    require_supported(parse_arch_list("80;90a;100a;101a;120a"), Version("12.8"))


def test_require_supported_sm101_on_13_0_says_renamed_sm110():
    with pytest.raises(ToolchainError) as exc:
        require_supported([Arch(10, 1, "a")], "13.0")
    err = exc.value
    assert "sm_101a is not available in CUDA 13.0" in err.what
    assert "renamed it sm_110a" in err.what
    assert "build sm_110a instead" in err.fix


def test_require_supported_with_real_nvcc_13_list():
    listed = frozenset(NVCC_13_0_LIST_GPU_ARCH.split())
    require_supported(parse_arch_list("75;88;90a;100f;103a;110f;120f;121"), "13.0", nvcc_archs=listed)
    with pytest.raises(ToolchainError, match="renamed it sm_110"):
        require_supported([Arch(10, 1)], "13.0", nvcc_archs=listed)


def test_nvcc_list_is_authoritative_for_the_base_arch():
    # an nvcc that reports 12.9 but was built without compute_121 (e.g. a trimmed toolkit)
    trimmed = frozenset({"compute_80", "compute_90", "compute_100", "compute_120"})
    with pytest.raises(ToolchainError) as exc:
        require_supported([Arch(12, 1)], "12.9", nvcc_archs=trimmed)
    assert "sm_121 is not supported by the selected nvcc (CUDA 12.9)" in exc.value.what
    assert "does not list compute_121; it lists compute_80, compute_90, compute_100, compute_120" in exc.value.why
    # and the other way round: a listed base arch passes even where the table disagrees
    require_supported([Arch(8, 8)], "12.9", nvcc_archs=frozenset({"compute_88"}))
    # variants still follow the table: 12.8 has compute_120 but no compute_120f
    with pytest.raises(ToolchainError, match="sm_120f needs CUDA 12.9 or newer"):
        require_supported([Arch(12, 0, "f")], "12.8", nvcc_archs=frozenset({"compute_120"}))


def test_require_supported_reports_the_first_failure_only():
    with pytest.raises(ToolchainError, match="sm_100f needs CUDA 12.9") as exc:
        require_supported(parse_arch_list("80;100f;103a"), "12.8")
    assert "sm_103a" not in str(exc.value)


def test_filter_supported_splits_and_keeps_order():
    kept, dropped = filter_supported(parse_arch_list("120f;80;103a;90a;101"), "12.8")
    assert kept == (Arch(8, 0), Arch(9, 0, "a"), Arch(10, 1))
    assert [d.arch for d in dropped] == [Arch(12, 0, "f"), Arch(10, 3, "a")]
    assert dropped[0] == Dropped(Arch(12, 0, "f"), "sm_120f needs CUDA 12.9 or newer, and the selected nvcc is CUDA 12.8")
    assert "12.9" in dropped[1].reason


def test_filter_supported_on_13_0_drops_sm101_with_the_rename():
    kept, dropped = filter_supported(parse_arch_list("90a;101;110"), "13.0",
                                     nvcc_archs=frozenset(NVCC_13_0_LIST_GPU_ARCH.split()))
    assert kept == (Arch(9, 0, "a"), Arch(11, 0))
    assert len(dropped) == 1 and "renamed it sm_110" in dropped[0].reason


# ------------------------------------------------------------------ nvcc --list-gpu-arch


def test_real_13_0_list_agrees_with_the_table():
    # kforge.build.toolchain.nvcc_info keeps the listing as whitespace-separated names
    listed = {int(name.split("_")[1]) for name in NVCC_13_0_LIST_GPU_ARCH.split()}
    assert listed == {a.number for a in supported_archs("13.0")}


def test_observed_arch_is_outside_the_table_but_compares_equal():
    old = Arch.observed(7, 0)
    assert old.sm == "sm_70" and old.number == 70
    assert Arch.observed(9, 0, "a") == Arch(9, 0, "a")
    with pytest.raises(ArchError, match="no longer supported"):
        old.info  # noqa: B018
    with pytest.raises(ArchError, match="not a CUDA arch"):
        Arch.observed(9, 0, "x")


@pytest.mark.parametrize(("text", "kind"), [("sm_90a", "sass"), ("compute_120f", "ptx"), ("lto_90", "lto"), ("10.3a", None),
                                            ("90", None)])
def test_code_kind_and_one_parse(text, kind):
    assert code_kind(text) == kind
    assert parse_arch(text).major in (9, 10, 12)


def test_importing_arch_does_not_import_the_renderers():
    code = "import sys, kforge.cuda.arch; print('kforge.cuda.render' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_module_has_no_second_copy_of_min_cuda_facts():
    # the renderers module must take every version fact from the table
    import inspect

    from kforge.cuda import render as archrender

    src = inspect.getsource(archrender)
    for fact in ('"12.8"', '"12.9"', '"11.8"', '"12.0"'):
        assert fact not in src, fact
    assert arch_mod.KNOWN_ARCHS is KNOWN_ARCHS
