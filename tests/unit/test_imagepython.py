"""kforge.build.imagepython: finding this host's CPython, its runtime libraries, and the recipe that lays it in the image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.build import imagepython
from kforge.errors import ToolchainError

LDD = """\
\tlinux-vdso.so.1 (0x00007ffc5a1f0000)
\tlibpython3.12.so.1.0 => /root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0 (0x00007f0d1e000000)
\tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f0d1df00000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0d1dc00000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0d1e600000)
\tlibmissing.so.1 => not found
"""


def test_parse_ldd_keeps_resolved_libraries_and_the_loader():
    libs = imagepython.parse_ldd(LDD)
    assert libs == {"libpython3.12.so.1.0": Path("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"),
                    "libssl.so.3": Path("/lib/x86_64-linux-gnu/libssl.so.3"),
                    "libc.so.6": Path("/lib/x86_64-linux-gnu/libc.so.6"),
                    "ld-linux-x86-64.so.2": Path("/lib64/ld-linux-x86-64.so.2")}
    assert imagepython.loader_name(libs) == "ld-linux-x86-64.so.2"


def _prefix(tmp_path: Path) -> Path:
    prefix = tmp_path / "py"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3.12").write_bytes(b"\x7fELF exe")
    (prefix / "lib" / "python3.12" / "lib-dynload").mkdir(parents=True)
    (prefix / "lib" / "libpython3.12.so.1.0").write_bytes(b"\x7fELF lib")
    (prefix / "lib" / "python3.12" / "lib-dynload" / "_ssl.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF ssl")
    (prefix / "lib" / "python3.12" / "os.py").write_text("# stdlib\n")
    (prefix / "lib" / "python3.12" / "site-packages" / "big").mkdir(parents=True)
    (prefix / "lib" / "python3.12" / "test").mkdir()
    return prefix


def test_runtime_libraries_leave_out_the_interpreters_own_and_add_glibcs_pieces(tmp_path):
    libdir = tmp_path / "libs"
    libdir.mkdir()
    for name in ("libc.so.6", "libssl.so.3", "librt.so.1", "libpthread.so.0"):
        (libdir / name).write_bytes(name.encode())
    prefix = _prefix(tmp_path)
    ldd = LDD.replace("/lib/x86_64-linux-gnu", str(libdir)).replace("/root/.pyenv/versions/3.12.1", str(prefix))

    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, ldd, "")
    libs = imagepython.runtime_libraries(imagepython.elf_files(prefix, "3.12"), prefix, {}, run=run)
    assert "libpython3.12.so.1.0" not in libs and libs["libssl.so.3"] == libdir / "libssl.so.3"
    assert libs["librt.so.1"] == libdir / "librt.so.1" and libs["libpthread.so.0"] == libdir / "libpthread.so.0"
    assert "libdl.so.2" not in libs  # only pieces that exist beside libc


def test_staging_copies_the_prefix_without_packages_and_tests_and_the_libraries_under_their_sonames(tmp_path):
    libdir = tmp_path / "libs"
    libdir.mkdir()
    for name in ("libc.so.6", "libssl.so.3"):
        (libdir / name).write_bytes(name.encode())
    (libdir / "ld-2.36.so").write_bytes(b"loader")
    (libdir / "ld-linux-x86-64.so.2").symlink_to("ld-2.36.so")
    prefix = _prefix(tmp_path)
    ldd = (LDD.replace("/lib/x86_64-linux-gnu", str(libdir)).replace("/root/.pyenv/versions/3.12.1", str(prefix))
           .replace("/lib64/ld-linux-x86-64.so.2", str(libdir / "ld-linux-x86-64.so.2")))

    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, ldd, "")
    py = imagepython.HostPython("3.12.1", prefix, prefix / "bin" / "python3.12", shared=True)
    staged = imagepython.stage_host_python(py, tmp_path / "cache", {}, run=run)
    assert staged.name.startswith("cp312-") and (staged / "prefix" / "lib" / "python3.12" / "os.py").is_file()
    assert not (staged / "prefix" / "lib" / "python3.12" / "site-packages").exists()
    assert not (staged / "prefix" / "lib" / "python3.12" / "test").exists()
    assert (staged / "runtime" / "libssl.so.3").read_bytes() == b"libssl.so.3"
    info = json.loads((staged / "python.json").read_text())
    assert info["host_prefix"] == str(prefix) and info["loader"] == "ld-linux-x86-64.so.2" and info["version"] == "3.12.1"
    loader = staged / "runtime" / "ld-linux-x86-64.so.2"
    assert not loader.is_symlink() and loader.read_bytes() == b"loader"  # the file, under the name PT_INTERP uses
    # a second call reuses the staged copy (same binaries, same identity)
    assert imagepython.stage_host_python(py, tmp_path / "cache", {}, run=lambda *a, **k: 1 / 0) == staged


def test_the_install_recipe_points_the_interpreter_at_its_own_glibc_and_cleans_the_host_prefix():
    lines = "\n".join(imagepython.install_script("3.12", "/root/.pyenv/versions/3.12.1", "ld-linux-x86-64.so.2"))
    rt = "/opt/python/cp312-cp312/lib/kforge-runtime"
    assert f"patchelf --set-interpreter {rt}/ld-linux-x86-64.so.2 /opt/python/cp312-cp312/bin/python3.12" in lines
    assert "--add-needed librt.so.1" in lines and "--add-needed libpthread.so.0" in lines
    assert f"--force-rpath --set-rpath {rt}:/opt/python/cp312-cp312/lib" in lines
    assert "s#-Wl,-rpath,/root/.pyenv/versions/3.12.1/lib##g" in lines  # extensions get no rpath to a host folder
    assert "s#/root/.pyenv/versions/3.12.1#/opt/python/cp312-cp312#g" in lines
    assert "-m ensurepip" in lines
    # one change per patchelf call: bullseye's patchelf 0.12 writes a wrong RPATH when they are combined
    calls = [line for line in lines.splitlines() if line.startswith("patchelf")]
    assert not any(sum(op in line for op in ("--set-interpreter", "--set-rpath", "--add-needed")) > 1 for line in calls)


def test_find_host_python_takes_the_first_cpython_of_that_version(tmp_path):
    answers = {"/a/python3.12": None, "/b/python3.12": {"impl": "CPython", "version": "3.12.1", "prefix": "/b",
                                                        "exe": "/b/python3.12", "shared": True}}

    def run(argv, **kw):
        data = answers[argv[0]]
        return subprocess.CompletedProcess(argv, 1 if data is None else 0, json.dumps(data) if data else "", "")
    env = {"KFORGE_IMAGE_PYTHON": "/a/python3.12", "PATH": "", "HOME": str(tmp_path)}
    assert imagepython.candidates("3.12", env) == ["/a/python3.12"]
    py = imagepython.find_host_python("3.12", {**env, "KFORGE_IMAGE_PYTHON": "/b/python3.12"}, run=run)
    assert py.version == "3.12.1" and py.prefix == Path("/b") and py.tag == "cp312"
    with pytest.raises(ToolchainError) as err:
        imagepython.find_host_python("3.12", env, run=run)
    assert "CPython 3.12" in str(err.value) and "/a/python3.12" in str(err.value) and "KFORGE_IMAGE_PYTHON" in str(err.value)


def test_this_interpreter_is_found_by_its_own_version():
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    py = imagepython.find_host_python(minor, {"KFORGE_IMAGE_PYTHON": sys.executable, "PATH": ""})
    assert py.minor == minor and py.prefix == Path(sys.base_prefix)
