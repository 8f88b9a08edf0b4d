"""Two builds of fmha-sm90 from the same source in two different folders give byte-identical wheels (no compiler
cache: real compiles). And a ``-lineinfo`` cubin through kforge's nvcc wrapper carries no file time or size in its
line table, neither of the checkout's files nor of the CUDA toolkit's headers.

Each build runs in its own clone of this repository (folders of different lengths, as two developers' or two
CI runners' checkouts are): the plan maps the checkout's folder to one name (kforge.build.reproducible), so no path
of either folder may reach the wheel. They share kforge's cache, so the second one starts its units longest
first (the ninja shim, from the unit times the first measured): the order must not change a byte either.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from kforge.cuda.enforce import install, plan_enforcement

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LINEINFO_UNIT = ("#include <cuda_fp16.h>\n"
                 "__global__ void k(__half* x) { x[threadIdx.x] = __hadd(x[threadIdx.x], x[0]); }\n")


def _uleb(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return out, i


def _cstr(b: bytes, i: int) -> tuple[str, int]:
    j = b.index(b"\0", i)
    return b[i:j].decode(), j + 1


def line_table_files(cubin: Path) -> list[tuple[str, int, int]]:
    """(path, mtime, size) of every file entry of the cubin's ``.debug_line`` (DWARF 2 headers, as ptxas writes)."""
    with cubin.open("rb") as fh:
        data = ELFFile(fh).get_section_by_name(".debug_line").data()
    out, off = [], 0
    while off < len(data):
        (length,) = struct.unpack_from("<I", data, off)
        i = off + 4 + 2 + 4 + 4  # unit length, version, header length; min length, is_stmt, line base, line range
        i += data[i]  # opcode_base, then opcode_base - 1 operand counts
        dirs = []
        while data[i]:
            d, i = _cstr(data, i)
            dirs.append(d)
        i += 1
        while data[i]:
            name, i = _cstr(data, i)
            d, i = _uleb(data, i)
            mtime, i = _uleb(data, i)
            size, i = _uleb(data, i)
            out.append((f"{dirs[d - 1]}/{name}" if d else name, mtime, size))
        off += 4 + length
    return out


def test_lineinfo_cubins_carry_no_file_times_through_the_wrapper(nvcc_env_and_host, tmp_path: Path) -> None:
    environ, host = nvcc_env_and_host
    nvcc = Path(host.nvcc_path)
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    src = root / "src" / "k.cu"
    src.write_text(LINEINFO_UNIT)
    flags = ["-gencode=arch=compute_90,code=sm_90"]
    e = plan_enforcement("on", flags, 1, backend="native", platform_os="linux", scripts_dir=None)
    setup = install(e, nvcc=nvcc, cuda_home=nvcc.parent.parent, dest=root / "wrap", env=environ,
                    path_maps=((str(root), "/kforge"),))
    env = {**environ, **setup.env}
    subprocess.run([str(setup.wrapper), "-cubin", "-lineinfo", str(src), "-o", str(tmp_path / "mapped.cubin")],
                   env=env, check=True, cwd=root / "src")
    subprocess.run([str(nvcc), "-cubin", "-lineinfo", *flags, str(src), "-o", str(tmp_path / "plain.cubin")],
                   env=environ, check=True)
    plain = line_table_files(tmp_path / "plain.cubin")
    # plain nvcc: ptxas read every file's time and size (the unit's, and the toolkit header's)
    assert len(plain) >= 2 and all(mtime > 0 and size > 0 for _, mtime, size in plain)
    mapped = line_table_files(tmp_path / "mapped.cubin")
    assert len(mapped) == len(plain) and all((mtime, size) == (0, 0) for _, mtime, size in mapped), mapped
    names = [name for name, _, _ in mapped]
    assert "/kforge/src/k.cu" in names and any(n.startswith("/kforge-cuda/") and "cuda_fp16" in n for n in names)


def clone(dest: Path) -> Path:
    """A real checkout of this repository's HEAD (kernels/fmha, forge.toml and the git history the build's
    SOURCE_DATE_EPOCH is read from; uncommitted changes are not in it). A local clone shares the object files,
    so it takes a second. kforge itself is the one under test (this interpreter's), not the clone's copy."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs this repository as a git checkout (the builds run in two clones of it)")
    dest.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True, timeout=300)
    return dest


@pytest.mark.slow
def test_two_fmha_builds_in_two_folders_are_byte_identical(tmp_path: Path) -> None:
    folders = (clone(tmp_path / "a" / "x"), clone(tmp_path / "bb" / "yyy"))
    digests = []
    for i, folder in enumerate(folders, 1):
        env = dict(os.environ, KFORGE_CACHE=str(tmp_path / "cache"), KFORGE_COMPILER_CACHE="none")
        env.pop("SOURCE_DATE_EPOCH", None)  # kforge sets it from the source
        wh = tmp_path / f"wh{i}"
        out = subprocess.run([sys.executable, "-m", "kforge.cli", "build", "fmha-sm90", "--wheelhouse", str(wh),
                              "--no-progress"], cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "reproducible: SOURCE_DATE_EPOCH=" in out.stderr and "-frandom-seed=fmha" in out.stderr
        assert f"-ffile-prefix-map={folder}=/kforge" in out.stderr  # the plan's map, for host and device code
        if i == 2:
            assert "build order: longest first" in out.stderr and "statements moved" in out.stderr
        (wheel,) = (wh / "fmha").glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            leaks = [(n, str(f)) for n in zf.namelist() for f in folders if os.fsencode(str(f)) in zf.read(n)]
        assert leaks == []
        digests.append((wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    assert digests[0] == digests[1]
