"""kforge.cuda.arch against the real nvcc: the table agrees with it, and rendered flags compile.

Uses ``$KFORGE_NVCC``, else ``$CUDA_HOME/bin/nvcc``, else ``/usr/local/cuda-13.0/bin/nvcc``, else
``nvcc`` on PATH. Every
compile is one tiny kernel at -O0; the whole module takes a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.build.toolchain import nvcc_info
from kforge.cuda.arch import (
    KNOWN_ARCHS,
    VARIANTS,
    Arch,
    parse_arch_list,
    require_supported,
    supported_archs,
)
from kforge.cuda.render import render_gencode
from kforge.errors import ToolchainError

pytestmark = pytest.mark.integration

KERNEL = "__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }\n"


@dataclass(frozen=True)
class RealNvcc:
    path: str
    cuda: Version
    listed: frozenset[str]


@pytest.fixture(scope="session")
def nvcc() -> RealNvcc:
    candidates = [os.environ.get("KFORGE_NVCC"), os.environ.get("CUDA_HOME") and f"{os.environ['CUDA_HOME']}/bin/nvcc",
                  "/usr/local/cuda-13.0/bin/nvcc", shutil.which("nvcc")]
    path = next((c for c in candidates if c and Path(c).is_file()), None)
    if not path:
        pytest.skip("no nvcc: set KFORGE_NVCC or put nvcc on PATH")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+\.\d+)", version)
    assert m, version
    listed = nvcc_info(Path(path)).gpu_archs  # kforge's own reading of `nvcc --list-gpu-arch`
    assert listed, "nvcc --list-gpu-arch printed nothing"
    return RealNvcc(path, Version(m[1]), listed)


@pytest.fixture(scope="session")
def kernel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("arch_nvcc") / "k.cu"
    src.write_text(KERNEL)
    return src


def compile_(nvcc: RealNvcc, kernel: Path, mode: str, flags: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, Path]:
    out = kernel.with_name(f"out_{abs(hash((mode,) + flags))}.{mode}")
    proc = subprocess.run(
        [nvcc.path, f"-{mode}", "-O0", "-Xptxas", "-O0", *flags, str(kernel), "-o", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    return proc, out


# What the fatbin header says (observed with nvcc 13.0: kind 1 = PTX, 2 = ELF; the SM number at
# byte 28 of each entry header; flag bits 0x100000 = 'a', 0x200000 = 'f' at byte 40).
@dataclass(frozen=True)
class Entry:
    kind: str
    sm: int
    variant: str


def fatbin_entries(data: bytes) -> list[Entry]:
    magic, _version, header, size = struct.unpack_from("<IHHQ", data, 0)
    assert magic == 0xBA55ED50, hex(magic)
    entries, off = [], header
    while off < header + size:
        kind, _v, entry_header, padded = struct.unpack_from("<HHIQ", data, off)
        sm = struct.unpack_from("<I", data, off + 28)[0]
        flags = struct.unpack_from("<I", data, off + 40)[0]
        variant = "a" if flags & 0x100000 else "f" if flags & 0x200000 else ""
        entries.append(Entry({1: "ptx", 2: "sass"}[kind], sm, variant))
        off += entry_header + padded
    return entries


def test_table_agrees_with_nvcc_list(nvcc):
    listed = {int(re.search(r"\d+", n)[0]) for n in nvcc.listed if n.startswith("compute_")}
    table = {a.number for a in supported_archs(nvcc.cuda)}
    assert listed - table == set(), f"nvcc {nvcc.cuda} lists archs the table says it lacks (or does not know)"
    assert table - listed == set(), f"the table says nvcc {nvcc.cuda} has archs it does not list"
    # and the nvcc list is consistent with require_supported's own view
    require_supported(supported_archs(nvcc.cuda, variants=True), nvcc.cuda, nvcc_archs=nvcc.listed)


def test_nvcc_accepts_every_variant_the_table_allows(nvcc, kernel):
    # --dryrun makes nvcc validate every -gencode (an unknown arch is fatal at once) without
    # running ptxas 23 times; the fatbin tests below compile real SASS for a few of them.
    archs = supported_archs(nvcc.cuda, variants=True)
    # sm_X and sm_Xf cannot share one compile (see test_plain_and_family_sass_clash), so two batches
    batches = [[a for a in archs if a.variant != "f"], [a for a in archs if a.variant == "f"]]
    for batch in batches:
        if not batch:
            continue
        flags = render_gencode(batch, ptx=True)
        proc = subprocess.run([nvcc.path, "--dryrun", "-fatbin", *flags, str(kernel), "-o", str(kernel) + ".fatbin"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        # the planned fatbinary command lists one ELF and one PTX image per arch
        planned = set(re.findall(r"--image3=kind=(elf|ptx),sm=(\d+[af]?)", proc.stdout + proc.stderr))
        assert planned == {(kind, a.suffixed) for a in batch for kind in ("elf", "ptx")}


@pytest.mark.parametrize("number", list(KNOWN_ARCHS))
def test_nvcc_rejects_every_variant_the_table_lacks(nvcc, kernel, number):
    info = KNOWN_ARCHS[number]
    absent = [v for v in VARIANTS if v and v not in info.variants]
    if nvcc.cuda > (info.max_cuda or nvcc.cuda) or nvcc.cuda < info.min_cuda:
        absent = list(VARIANTS)  # the whole arch is missing from this nvcc
    for v in absent:
        code = f"{number}{v}"
        proc, _ = compile_(nvcc, kernel, "cubin", (f"-gencode=arch=compute_{code},code=sm_{code}",))
        assert proc.returncode != 0 and "Unsupported gpu architecture" in proc.stderr, (code, proc.stderr)


def test_plain_and_family_sass_clash(nvcc, kernel):
    """The reason render_gencode drops sm_X SASS next to sm_Xf; if nvcc ever allows both, revisit it."""
    if nvcc.cuda < Version("12.9"):
        pytest.skip("no family variants before CUDA 12.9")
    clash = ("-gencode=arch=compute_120,code=sm_120", "-gencode=arch=compute_120f,code=sm_120f")
    proc, _ = compile_(nvcc, kernel, "fatbin", clash)
    assert proc.returncode != 0 and "family-specific" in proc.stderr, proc.stderr
    proc, out = compile_(nvcc, kernel, "fatbin", render_gencode(parse_arch_list("120+PTX;120f"), ptx=False))
    assert proc.returncode == 0, proc.stderr
    got = sorted(fatbin_entries(out.read_bytes()), key=lambda e: (e.kind, e.sm))
    assert got == [Entry("ptx", 120, ""), Entry("sass", 120, "f")]


@pytest.mark.parametrize(
    ("archs", "ptx", "sm"),
    [("sm_90a", False, 90), ("sm_120f", False, 120), ("sm_80", False, 80)],
)
def test_rendered_gencode_builds_a_cubin(nvcc, kernel, archs, ptx, sm):
    flags = render_gencode(parse_arch_list(archs), ptx=ptx)
    require_supported(parse_arch_list(archs), nvcc.cuda, nvcc_archs=nvcc.listed)
    proc, out = compile_(nvcc, kernel, "cubin", flags)
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert struct.unpack_from("<H", data, 18)[0] == 190  # EM_CUDA
    assert (struct.unpack_from("<I", data, 48)[0] >> 8) & 0xFF == sm  # e_flags carries the SM number


@pytest.mark.parametrize(
    ("archs", "ptx", "expected"),
    [
        ("sm_80+PTX", False, [Entry("ptx", 80, ""), Entry("sass", 80, "")]),
        ("sm_90a", "last", [Entry("ptx", 90, "a"), Entry("sass", 90, "a")]),
        ("80;90a;120f", "last", [Entry("ptx", 120, "f"), Entry("sass", 80, ""), Entry("sass", 90, "a"),
                                 Entry("sass", 120, "f")]),
    ],
)
def test_rendered_gencode_builds_a_fatbin_with_exactly_those_archs(nvcc, kernel, archs, ptx, expected):
    parsed = parse_arch_list(archs)
    require_supported(parsed, nvcc.cuda, nvcc_archs=nvcc.listed)
    proc, out = compile_(nvcc, kernel, "fatbin", render_gencode(parsed, ptx=ptx))
    assert proc.returncode == 0, proc.stderr
    got = sorted(fatbin_entries(out.read_bytes()), key=lambda e: (e.kind, e.sm))
    assert got == expected


def test_sm101_is_gone_from_cuda_13(nvcc):
    if nvcc.cuda < Version("13.0"):
        pytest.skip("sm_101 exists before CUDA 13.0")
    assert "compute_101" not in nvcc.listed and "compute_110" in nvcc.listed
    with pytest.raises(ToolchainError, match="renamed it sm_110"):
        require_supported([Arch(10, 1)], nvcc.cuda, nvcc_archs=nvcc.listed)
