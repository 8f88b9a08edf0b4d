"""flash_attn_standalone's packaging, without a GPU and without the FlashAttention-3 sources.

The files of ``hopper/standalone`` that the packaging is made of (its ``CMakeLists.txt``, the C
header, the CMake package template in ``cmake/`` and the stand-in source) come out of the
flash-attn3 patch series with ``git apply --include`` into an empty folder: the patches create
them, so no upstream tree is needed. The real ``CMakeLists.txt`` is configured with
``-DFA3S_STUB=ON`` (a library with the header's exports and no kernels, no CUDA compiler), built
and installed in both layouts (GNU prefix and the wheel's package folder); the prefix is moved
elsewhere, and ``examples/fa3-standalone-consumer`` is built against it with
``find_package(flash_attn_standalone)`` and run.

KFORGE_TEST_FA3_TREE=<flash-attention checkout> takes the files from that working tree instead
(while the patch is being written).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from kforge.sources.series import PatchContext, load_series

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERIES = ROOT / "patches" / "flash-attn3"
EXAMPLE = ROOT / "examples" / "fa3-standalone-consumer"
STANDALONE = "hopper/standalone"
HEADER = f"{STANDALONE}/include/flash_attn_standalone.h"
#: What the stub build reads, relative to hopper/standalone (git apply --include patterns).
PACKAGING = ("CMakeLists.txt", "include/*", "cmake/*", "src/flash_attn_standalone_stub.c")
#: The flash-attn3 build the series is selected for (forge.toml: linux-x86_64, sm_90a, FA3 3.0.0).
CONTEXT = PatchContext("linux-x86_64", ("sm_90a",), "3.0.0")
LAYOUTS = {
    # layout: (extra configure arguments, the package prefix inside the install prefix)
    "gnu": ((), ""),
    "wheel": (("-DSKBUILD=2",), "flash_attn_standalone"),
}


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if ok and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}",
                    pytrace=False)
    return proc


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    found = {name: shutil.which(name) for name in ("cmake", "git", "ninja")}
    if found["cmake"] is None:
        pytest.skip("cmake is not installed: the test configures flash_attn_standalone's CMakeLists.txt "
                    "(.ci/run installs it)")
    if found["git"] is None:
        pytest.skip("git is not installed: the test extracts the files from the patch with git apply")
    return {k: v for k, v in found.items() if v}


@pytest.fixture(scope="module")
def cuda_root() -> str:
    """The CUDA toolkit the example links its own cudart from (it allocates device memory)."""
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda-13.0", "/usr/local/cuda"):
        if home and Path(home, "include", "cuda_runtime_api.h").is_file():
            return home
    pytest.skip("no CUDA toolkit (CUDA_HOME, /usr/local/cuda-13.0): the example links the CUDA runtime")


def patches_with_standalone() -> list[Path]:
    """The series' patches (in order, as selected for the flash-attn3 build) that touch hopper/standalone."""
    return [e.path for e in load_series(SERIES).select(CONTEXT)
            if f"b/{STANDALONE}/" in e.path.read_text(encoding="utf-8", errors="replace")]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, tools) -> Path:
    """An otherwise empty folder holding hopper/standalone's packaging files; returns hopper/standalone."""
    root = tmp_path_factory.mktemp("fa3s_src")
    tree = os.environ.get("KFORGE_TEST_FA3_TREE")
    if tree:
        src = Path(tree) / STANDALONE
        for pattern in PACKAGING:
            for f in src.glob(pattern):
                dest = root / STANDALONE / f.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest)
    else:
        patches = patches_with_standalone()
        if not any(f"+++ b/{HEADER}" in p.read_text(encoding="utf-8", errors="replace") for p in patches):
            pytest.skip(f"no patch in {SERIES.relative_to(ROOT)} creates {HEADER} yet; "
                        "KFORGE_TEST_FA3_TREE=<flash-attention checkout> tests a working tree instead")
        run([tools["git"], "init", "-q", str(root)])  # so git apply works relative to root, whatever is above it
        includes = [f"--include={STANDALONE}/{p}" for p in PACKAGING]
        for patch in patches:
            run([tools["git"], "apply", *includes, str(patch)], cwd=root)
    missing = [p for p in ("CMakeLists.txt", "include/flash_attn_standalone.h",
                           "cmake/flash_attn_standalone-config.cmake.in", "src/flash_attn_standalone_stub.c")
               if not (root / STANDALONE / p).is_file()]
    assert missing == [], f"the packaging files are incomplete: {missing}"
    return root / STANDALONE


def generator(tools: dict[str, str]) -> list[str]:
    return ["-G", "Ninja"] if "ninja" in tools else []


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def installed(request, tmp_path_factory, tools, standalone) -> tuple[str, Path, str]:
    """The stub library configured, built and installed in one layout, then moved to another folder
    (the build tree and the first prefix deleted): (layout, package prefix, configure output)."""
    layout = request.param
    extra, package = LAYOUTS[layout]
    work = tmp_path_factory.mktemp(f"fa3s_{layout}")
    build, prefix, moved = work / "build", work / "prefix", work / "moved"
    configure = run([tools["cmake"], "-S", str(standalone), "-B", str(build), *generator(tools), "-DFA3S_STUB=ON",
                     "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_INSTALL_PREFIX={prefix}", *extra])
    run([tools["cmake"], "--build", str(build)])
    run([tools["cmake"], "--install", str(build)])
    shutil.copytree(prefix, moved, symlinks=True)
    shutil.rmtree(prefix)
    shutil.rmtree(build)
    return layout, moved / package if package else moved, configure.stdout


def library_files(prefix: Path) -> list[Path]:
    return sorted(prefix.rglob("libflash_attn_standalone.so*"))


def header_functions(header: Path) -> set[str]:
    """The functions the header declares FA3S_API (declarations start a line with it)."""
    return set(re.findall(r"^FA3S_API\s+[^;(]*?\b(\w+)\s*\(", header.read_text(), re.M))


def abi_version(standalone: Path) -> str:
    return re.search(r"^#define FA3S_ABI_VERSION (\d+)$", (standalone / "include" / "flash_attn_standalone.h").read_text(),
                     re.M)[1]


def test_configure_reports_the_stub(installed):
    _layout, _prefix, out = installed
    assert "profile stub, archs none" in out
    assert "FA3S_STUB=ON: building the stand-in library" in out


def test_install_layout(installed):
    layout, prefix, _ = installed
    files = sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if not p.is_dir())
    libs = library_files(prefix)
    assert libs, files
    libdir = libs[0].parent.relative_to(prefix).as_posix()
    cmake_dir = f"{libdir}/cmake/flash_attn_standalone"
    package = {f"{cmake_dir}/flash_attn_standalone-config.cmake",
               f"{cmake_dir}/flash_attn_standalone-config-version.cmake",
               f"{cmake_dir}/flash_attn_standalone-targets.cmake",
               f"{cmake_dir}/flash_attn_standalone-targets-release.cmake",
               "include/flash_attn_standalone.h"}
    if layout == "wheel":
        # One file, no soname symlinks (a wheel cannot hold links); lib/ of the package folder.
        assert libdir == "lib"
        assert set(files) == package | {"lib/libflash_attn_standalone.so"}
    else:
        assert libdir in ("lib", "lib64")  # GNUInstallDirs' choice for this platform
        assert set(files) == package | {f"{libdir}/libflash_attn_standalone.so{s}" for s in ("", ".1", ".3.0.0")}
        assert os.readlink(prefix / libdir / "libflash_attn_standalone.so") == "libflash_attn_standalone.so.1"


def test_library_exports_exactly_the_header_api(installed, standalone):
    layout, prefix, _ = installed
    lib = next(p for p in library_files(prefix) if not p.is_symlink())
    with lib.open("rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        exported = {s.name for s in dynsym.iter_symbols()
                    if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["type"] == "STT_FUNC"
                    and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and s["st_other"]["visibility"] == "STV_DEFAULT"}
        dynamic = elf.get_section_by_name(".dynamic")
        tags = {t.entry.d_tag: t for t in dynamic.iter_tags()}
        needed = [t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    api = header_functions(standalone / "include" / "flash_attn_standalone.h")
    assert len(api) >= 7 and "fa3s_fwd" in api and "mha_fwd_standalone" in api
    assert exported == api
    assert not [n for n in needed if "cudart" in n]
    if layout == "gnu":
        assert tags["DT_SONAME"].soname == f"libflash_attn_standalone.so.{abi_version(standalone)}"


def test_example_builds_and_runs_against_the_moved_prefix(installed, standalone, tools, cuda_root, tmp_path):
    _layout, prefix, _ = installed
    build = tmp_path / "example"
    configure = run([tools["cmake"], "-S", str(EXAMPLE), "-B", str(build), *generator(tools),
                     f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCUDAToolkit_ROOT={cuda_root}"])
    assert f"flash_attn_standalone 3.0.0 from {prefix}" in configure.stdout
    assert "profile stub, archs none" in configure.stdout
    run([tools["cmake"], "--build", str(build)])
    proc = run([str(build / "fa3_consumer")], ok=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"flash_attn_standalone: ABI {abi_version(standalone)}, profile stub, archs none, head dims: none"
    assert lines[-1].startswith("fa3s_fwd: FA3S_ERROR_DEVICE (stub: fa3s_fwd: ")


@pytest.mark.parametrize("installed", ["gnu"], indirect=True)  # the version file is the same in both layouts
@pytest.mark.parametrize(("wanted", "found"), [("3.0", True), ("3", True), ("4", False), ("2.9", False)])
def test_the_package_checks_the_version_asked_for(installed, standalone, tools, tmp_path, wanted, found):
    _layout, prefix, _ = installed
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.24)\nproject(v LANGUAGES C)\n"
        f"find_package(flash_attn_standalone {wanted} REQUIRED)\n"
        "message(STATUS \"found ${flash_attn_standalone_VERSION} abi ${flash_attn_standalone_ABI_VERSION} "
        "stub ${flash_attn_standalone_STUB} include ${flash_attn_standalone_INCLUDE_DIR}\")\n")
    proc = run([tools["cmake"], "-S", str(project), "-B", str(tmp_path / "build"), *generator(tools),
                f"-DCMAKE_PREFIX_PATH={prefix}"], ok=False)
    if found:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"found 3.0.0 abi {abi_version(standalone)} stub ON include {prefix}/include" in proc.stdout
    else:
        assert proc.returncode != 0
        assert "3.0.0" in proc.stderr and "flash_attn_standalone" in proc.stderr
