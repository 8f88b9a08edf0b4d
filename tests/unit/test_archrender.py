"""kforge.cuda.render: every upstream knob format, with exact expected strings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from packaging.version import Version

from kforge.cuda import arch as arch_api
from kforge.cuda.arch import Arch, parse_arch, parse_arch_list
from kforge.cuda.render import (
    CMAKE_FAMILY_SUFFIX_MIN,
    RENDERERS,
    default_variant,
    render_cmake_architectures,
    render_disable_flags,
    render_flashinfer,
    render_gencode,
    render_knob,
    render_numbers,
    render_torch_arch_list,
)
from kforge.errors import ArchError, ToolchainError

A = parse_arch_list  # short alias for the tables below

FLASH_MLA_FAMILIES = {"SM90": {90}, "SM100": {100, 103}}


def test_arch_does_not_reexport_the_renderers():
    # archrender imports arch, never the reverse: no lazy re-export either
    with pytest.raises(AttributeError):
        arch_api.render_gencode  # noqa: B018


@dataclass(frozen=True)
class Knob:
    format: str
    env: str | None = None
    prefix: str | None = None
    value: str = "1"
    families: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    only: tuple[int, ...] | None = None


CUDA13 = Version("13.0")


def test_renderer_names():
    assert set(RENDERERS) == {"gencode", "numbers", "torch", "cmake", "flashinfer", "disable-flags"}


@pytest.mark.parametrize(
    ("knob", "archs", "expected"),
    [
        (Knob("numbers", "FLASH_ATTN_CUDA_ARCHS"), "80;120", {"FLASH_ATTN_CUDA_ARCHS": "80;120"}),
        (Knob("torch", "TORCH_CUDA_ARCH_LIST"), "100a;120a", {"TORCH_CUDA_ARCH_LIST": "10.0a;12.0a+PTX"}),
        (Knob("cmake", "CMAKE_CUDA_ARCHITECTURES"), "80;90a", {"CMAKE_CUDA_ARCHITECTURES": "80-real;90a"}),
        (Knob("flashinfer", "FLASHINFER_CUDA_ARCH_LIST"), "80;90;120", {"FLASHINFER_CUDA_ARCH_LIST": "8.0 9.0a 12.0f"}),
        (Knob("gencode", "NVCC_APPEND_FLAGS", only=(120, 121)), "100f;120a",
         {"NVCC_APPEND_FLAGS": "-gencode=arch=compute_120a,code=sm_120a -gencode=arch=compute_120a,code=compute_120a"}),
        (Knob("gencode", "NVCC_APPEND_FLAGS", only=(120, 121)), "90a;100f", {}),
        (Knob("disable-flags", prefix="FLASH_MLA_DISABLE_", families={"SM90": (90,), "SM100": (100, 103)}), "100f;120a",
         {"FLASH_MLA_DISABLE_SM90": "1"}),
        (Knob("disable-flags", prefix="FLASH_ATTENTION_DISABLE_", value="TRUE", families={"SM80": (80,)}), "90a",
         {"FLASH_ATTENTION_DISABLE_SM80": "TRUE"}),
    ],
)
def test_every_renderer_has_one_signature_and_takes_the_set(knob, archs, expected):
    assert RENDERERS[knob.format](A(archs), knob, CUDA13) == expected
    assert render_knob(knob, A(archs), "13.0") == expected


@pytest.mark.parametrize(("ptx", "torch", "cmake", "gencode"), [
    (False, "9.0a;12.0a", "90a-real;120a-real", ("-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_120a,code=sm_120a")),
    ("last", "9.0a;12.0a+PTX", "90a-real;120a", ("-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_120a,code=sm_120a",
                                                 "-gencode=arch=compute_120a,code=compute_120a")),
    (True, "9.0a+PTX;12.0a+PTX", "90a;120a", ("-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90a,code=compute_90a",
                                              "-gencode=arch=compute_120a,code=sm_120a", "-gencode=arch=compute_120a,code=compute_120a")),
])
def test_render_knob_follows_the_builds_ptx_policy(ptx, torch, cmake, gencode):
    """The knobs that can say PTX follow the plan's policy (kforge.config.binarypolicy); the others cannot."""
    archs = A("90a;120a")
    assert render_knob(Knob("torch", "T"), archs, CUDA13, ptx=ptx) == {"T": torch}
    assert render_knob(Knob("cmake", "C"), archs, CUDA13, ptx=ptx) == {"C": cmake}
    assert render_knob(Knob("gencode", "G"), archs, CUDA13, ptx=ptx) == {"G": " ".join(gencode)}
    assert render_knob(Knob("numbers", "N"), archs, CUDA13, ptx=ptx) == {"N": "90;120"}


def test_render_knob_unknown_format():
    with pytest.raises(ArchError, match="has no renderer.*did you mean 'numbers'"):
        render_knob(Knob("number", "X"), A("80"), CUDA13)


# ------------------------------------------------------------------ gencode


@pytest.mark.parametrize(
    ("archs", "ptx", "expected"),
    [
        ("90a", "last", ("-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90a,code=compute_90a")),
        ("90a", False, ("-gencode=arch=compute_90a,code=sm_90a",)),
        ("80;90a;120", "last", (
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-gencode=arch=compute_120,code=sm_120",
            "-gencode=arch=compute_120,code=compute_120",
        )),
        ("120f;80", "last", (  # "last" is the highest arch, not the last one written
            "-gencode=arch=compute_120f,code=sm_120f",
            "-gencode=arch=compute_120f,code=compute_120f",
            "-gencode=arch=compute_80,code=sm_80",
        )),
        ("80;90", True, (
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_80,code=compute_80",
            "-gencode=arch=compute_90,code=sm_90",
            "-gencode=arch=compute_90,code=compute_90",
        )),
        ("80+PTX;90a", False, (
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_80,code=compute_80",
            "-gencode=arch=compute_90a,code=sm_90a",
        )),
        ("80+PTX;90a", "last", (
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_80,code=compute_80",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-gencode=arch=compute_90a,code=compute_90a",
        )),
        ("90;90a", "last", (  # 90a sorts above 90
            "-gencode=arch=compute_90,code=sm_90",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-gencode=arch=compute_90a,code=compute_90a",
        )),
    ],
)
def test_render_gencode(archs, ptx, expected):
    assert render_gencode(A(archs), ptx=ptx) == expected


def test_render_gencode_defaults_to_ptx_for_the_highest_arch():
    assert render_gencode(A("100a;80")) == (
        "-gencode=arch=compute_100a,code=sm_100a",
        "-gencode=arch=compute_100a,code=compute_100a",
        "-gencode=arch=compute_80,code=sm_80",
    )


def test_render_gencode_dedupes_hand_built_lists():
    got = render_gencode([Arch(9, 0), Arch(9, 0, ptx=True), Arch(8, 0)], ptx=False)
    assert got == (
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
        "-gencode=arch=compute_80,code=sm_80",
    )


@pytest.mark.parametrize("bad", [(), ["sm_90"]])
def test_render_gencode_rejects_empty_or_unparsed(bad):
    with pytest.raises(ArchError):
        render_gencode(bad)


def test_render_gencode_rejects_unknown_ptx_policy():
    with pytest.raises(ArchError, match="unknown PTX policy 'first'"):
        render_gencode(A("90"), ptx="first")  # type: ignore[arg-type]


# ------------------------------------------------------------------ numbers / torch / cmake


@pytest.mark.parametrize(
    ("archs", "sep", "expected"),
    [
        ("80;90;120", ";", "80;90;120"),
        ("80;90a;100f;120a+PTX", ";", "80;90;100;120"),
        ("90a;90;80", ";", "90;80"),
        ("80;90;120", ",", "80,90,120"),
        ("80 110f", " ", "80 110"),
    ],
)
def test_render_numbers(archs, sep, expected):
    assert render_numbers(A(archs), sep) == expected


@pytest.mark.parametrize(
    ("archs", "ptx", "expected"),
    [
        ("80;90a;120", "last", "8.0;9.0a;12.0+PTX"),
        ("80;90a;120+PTX", False, "8.0;9.0a;12.0+PTX"),
        ("80;90a;120", False, "8.0;9.0a;12.0"),
        ("80;90a", True, "8.0+PTX;9.0a+PTX"),
        ("75;100a;103;121a", "last", "7.5;10.0a;10.3;12.1a+PTX"),
        ("87;110a", False, "8.7;11.0a"),
    ],
)
def test_render_torch_arch_list(archs, ptx, expected):
    assert render_torch_arch_list(A(archs), ptx=ptx) == expected


@pytest.mark.parametrize(
    ("archs", "ptx", "expected"),
    [
        ("80;90a;120a", "last", "80-real;90a-real;120a"),
        ("80;90a;120a", False, "80-real;90a-real;120a-real"),
        ("80;90a;120a", True, "80;90a;120a"),
        ("80+PTX;90a;120a", False, "80;90a-real;120a-real"),
        ("100f;120f", "last", "100f-real;120f"),
    ],
)
def test_render_cmake_architectures(archs, ptx, expected):
    assert render_cmake_architectures(A(archs), ptx=ptx) == expected


def test_render_cmake_refuses_family_archs_on_old_cmake():
    assert CMAKE_FAMILY_SUFFIX_MIN == Version("4.0")
    assert render_cmake_architectures(A("90a;120a"), cmake="3.25.1") == "90a-real;120a"
    assert render_cmake_architectures(A("90a;120f"), cmake="4.0.3") == "90a-real;120f"
    with pytest.raises(ToolchainError) as exc:
        render_cmake_architectures(A("90a;120f"), cmake="3.31.6")
    assert exc.value.what == "CMake 3.31.6 cannot take 120f in CMAKE_CUDA_ARCHITECTURES"
    assert "use CMake >= 4.0" in exc.value.fix and "120a or 120" in exc.value.fix


# ------------------------------------------------------------------ flashinfer and its variant rule


@pytest.mark.parametrize(
    ("arch", "cuda", "expected"),
    [
        ("sm_120", "13.0", "sm_120f"),
        ("sm_120", "12.8", "sm_120a"),
        ("sm_120", "12.9", "sm_120f"),  # FlashInfer 0.6.x: 12.0 -> f from CUDA 12.9
        ("sm_121", "13.0", "sm_121a"),  # ... and every other 12.x minor -> a (its own cubin)
        ("sm_90", "12.8", "sm_90a"),
        ("sm_90", "13.0", "sm_90a"),
        ("sm_100", "12.8", "sm_100a"),
        ("sm_103", "13.0", "sm_103a"),
        ("sm_110", "13.0", "sm_110a"),
        ("sm_89", "13.0", "sm_89"),
        ("sm_80", "12.8", "sm_80"),
        ("sm_75", "13.0", "sm_75"),
        ("sm_120f", "12.9", "sm_120f"),  # explicit variants are kept
        ("sm_100f", "13.0", "sm_100f"),
        ("sm_90a", "13.0", "sm_90a"),
        ("sm_90", "11.8", "sm_90"),  # 11.8 has no compute_90a: the rule falls back to the base arch
    ],
)
def test_default_variant(arch, cuda, expected):
    assert default_variant(parse_arch(arch), cuda).sm == expected


def test_default_variant_keeps_ptx():
    assert default_variant(parse_arch("120+PTX"), "13.0") == Arch(12, 0, "f", ptx=True)


@pytest.mark.parametrize(
    ("archs", "cuda", "expected"),
    [
        ("120", "13.0", "12.0f"),
        ("120", "12.8", "12.0a"),
        ("75;80;89;90;100;120", "12.8", "7.5 8.0 8.9 9.0a 10.0a 12.0a"),  # FlashInfer's cu12.8 release list
        ("75;80;89;90;100;103;120", "13.0", "7.5 8.0 8.9 9.0a 10.0a 10.3a 12.0f"),
        ("90a;90", "13.0", "9.0a"),
        ("100f;120a", "13.0", "10.0f 12.0a"),
    ],
)
def test_render_flashinfer(archs, cuda, expected):
    assert render_flashinfer(A(archs), cuda) == expected


# ------------------------------------------------------------------ disable flags (FlashMLA)


@pytest.mark.parametrize(
    ("archs", "expected"),
    [
        ("120", {"FLASH_MLA_DISABLE_SM90": "1", "FLASH_MLA_DISABLE_SM100": "1"}),
        ("90a", {"FLASH_MLA_DISABLE_SM100": "1"}),
        ("103a", {"FLASH_MLA_DISABLE_SM90": "1"}),
        ("100f", {"FLASH_MLA_DISABLE_SM90": "1"}),
        ("90a;100f", {}),
        ("90a;103", {}),
    ],
)
def test_render_disable_flags(archs, expected):
    assert render_disable_flags(A(archs), FLASH_MLA_FAMILIES, "FLASH_MLA_DISABLE_") == expected


def test_render_disable_flags_keeps_family_order():
    got = render_disable_flags(A("80"), {"SM100": {100}, "SM90": {90}}, "X_")
    assert list(got) == ["X_SM100", "X_SM90"]


# ------------------------------------------------------------------ sm_X next to sm_Xf
# nvcc 13.0 refuses code=sm_100 and code=sm_100f in one compile ("The same GPU code (`sm_100f`)
# generated for non family-specific and family-specific GPU arch"); the integration test
# tests/integration/test_arch_nvcc.py checks that this rule is still true and still needed.


def test_gencode_drops_plain_sass_next_to_its_family_variant():
    assert render_gencode(A("100;100f;120"), ptx=False) == (
        "-gencode=arch=compute_100f,code=sm_100f",
        "-gencode=arch=compute_120,code=sm_120",
    )
    # the plain arch's PTX survives (only its SASS clashes)
    assert render_gencode(A("100+PTX;100f"), ptx=False) == (
        "-gencode=arch=compute_100,code=compute_100",
        "-gencode=arch=compute_100f,code=sm_100f",
    )
    # a and f of one arch do not clash
    assert render_gencode(A("100a;100f"), ptx=False) == (
        "-gencode=arch=compute_100a,code=sm_100a",
        "-gencode=arch=compute_100f,code=sm_100f",
    )


def test_cmake_uses_virtual_for_a_plain_arch_next_to_its_family_variant():
    assert render_cmake_architectures(A("100+PTX;100f;120"), ptx=False) == "100-virtual;100f-real;120-real"
    assert render_cmake_architectures(A("100;100f"), ptx="last") == "100f"


@pytest.mark.parametrize(("archs", "suggestion"), [("80;120f", "sm_120a or sm_120"), ("100;100f", "sm_100a or sm_100"),
                                                 ("88", "drop sm_88")])
def test_torch_list_refuses_what_torch_rejects(archs, suggestion):
    # torch 2.11.0's cpp_extension raises "Unknown CUDA arch" for every 'f' variant and for 8.8
    with pytest.raises(ArchError, match="TORCH_CUDA_ARCH_LIST cannot name") as exc:
        render_torch_arch_list(A(archs))
    assert suggestion in exc.value.fix


def test_flashinfer_next_to_family_variant():
    assert render_flashinfer(A("120;120f"), "13.0") == "12.0f"
    assert render_flashinfer(A("100f;100"), "12.9") == "10.0f 10.0a"
