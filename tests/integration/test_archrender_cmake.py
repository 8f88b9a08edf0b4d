"""render_cmake_architectures against the real CMake: what it writes, CMake turns into the right nvcc flags.

Configures (does not build) a one-file CUDA project. CMake before 4.0 must refuse an ``f`` arch,
which is what CMAKE_FAMILY_SUFFIX_MIN claims; from 4.0 on it must take it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.cuda.arch import parse_arch_list
from kforge.cuda.render import CMAKE_FAMILY_SUFFIX_MIN, render_cmake_architectures
from kforge.errors import ToolchainError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cmake_project(tmp_path_factory):
    cmake = shutil.which("cmake")
    nvcc = next((c for c in (os.environ.get("KFORGE_NVCC"),
                             os.environ.get("CUDA_HOME") and f"{os.environ['CUDA_HOME']}/bin/nvcc",
                             "/usr/local/cuda-13.0/bin/nvcc", shutil.which("nvcc")) if c and Path(c).is_file()), None)
    if not cmake or not nvcc:
        pytest.skip("needs cmake and nvcc")
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=True).stdout
    version = Version(re.search(r"cmake version (\d+\.\d+\.\d+)", out)[1])
    if version < Version("3.25"):
        pytest.skip(f"CMake {version} is older than the 3.25 kforge documents")
    src = tmp_path_factory.mktemp("cmake_arch")
    (src / "k.cu").write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n")
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\nproject(k LANGUAGES CUDA)\nadd_library(k OBJECT k.cu)\n"
    )
    return cmake, nvcc, version, src


def configure(cmake_project, archs: str) -> tuple[subprocess.CompletedProcess, str]:
    cmake, nvcc, _version, src = cmake_project
    build = src / f"build_{re.sub(r'[^0-9a-z]+', '_', archs)}"
    proc = subprocess.run(
        [cmake, "-S", str(src), "-B", str(build), "-G", "Unix Makefiles", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"],
        capture_output=True, text=True, env={**os.environ, "CUDACXX": nvcc}, timeout=300, check=False,
    )
    flags = build / "CMakeFiles" / "k.dir" / "flags.make"
    return proc, flags.read_text() if flags.exists() else ""


def test_cmake_turns_rendered_a_archs_into_the_expected_gencodes(cmake_project):
    value = render_cmake_architectures(parse_arch_list("80;90a;120a"), cmake=cmake_project[2])
    assert value == "80-real;90a-real;120a"
    proc, flags = configure(cmake_project, value)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = re.findall(r"--generate-code=arch=(compute_\w+),code=\[([\w,]+)\]", flags)
    assert got == [("compute_80", "sm_80"), ("compute_90a", "sm_90a"), ("compute_120a", "compute_120a,sm_120a")]


def test_family_archs_match_cmake_family_suffix_min(cmake_project):
    version = cmake_project[2]
    family = parse_arch_list("100f;120f")
    if version < CMAKE_FAMILY_SUFFIX_MIN:
        with pytest.raises(ToolchainError, match=f"CMake {version} cannot take 100f"):
            render_cmake_architectures(family, cmake=version)
        # and CMake itself agrees: it refuses the value at configure time
        proc, _ = configure(cmake_project, render_cmake_architectures(family))
        assert proc.returncode != 0 and "CMAKE_CUDA_ARCHITECTURES" in proc.stderr, proc.stderr[-3000:]
    else:
        value = render_cmake_architectures(family, cmake=version)
        proc, flags = configure(cmake_project, value)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = re.findall(r"--generate-code=arch=(compute_\w+),code=\[([\w,]+)\]", flags)
        assert got == [("compute_100f", "sm_100f"), ("compute_120f", "compute_120f,sm_120f")]
