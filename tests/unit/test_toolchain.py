"""kforge.build.toolchain with injected runners and PATH lookups (the real nvcc/ccache/pip are in integration)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.build import toolchain
from kforge.cuda import nvccwrap
from kforge.errors import ToolchainError


def _done(argv, rc=0, out="", err=""):
    return subprocess.CompletedProcess(argv, rc, out, err)


def _fake_nvcc(tmp: Path, name: str) -> Path:
    nvcc = tmp / name / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    return nvcc


def _runner(versions: dict[str, str]):
    """nvcc at path P reports versions[P]; --list-gpu-arch/code list a few archs."""

    def run(argv, **kw):
        path, flag = argv[0], argv[1]
        if flag == "--version":
            v = versions[path]
            mm = ".".join(v.split(".")[:2])
            return _done(argv, out=f"nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release {mm}, V{v}\n")
        if flag == "--list-gpu-arch":
            return _done(argv, out="compute_75\ncompute_80\ncompute_90\ncompute_100\ncompute_120\n")
        if flag == "--list-gpu-code":
            return _done(argv, out="sm_75\nsm_80\nsm_90\nsm_90a\nsm_100\nsm_100a\nsm_120\n")
        if flag == "--dryrun":  # no "#$ TOP=" line: the home is two levels above nvcc
            return _done(argv, err="#$ _NVVM_BRANCH_=nvvm\n")
        raise AssertionError(argv)

    return run


def test_wrapper_nvcc_gets_the_home_nvcc_reports(tmp_path: Path) -> None:
    """/usr/local/bin/nvcc as a wrapper script: CUDA_HOME is the toolkit nvcc's dry run names, not /usr/local."""
    real = _fake_nvcc(tmp_path, "cuda-13.0")
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"#!/bin/sh\nexec {real} \"$@\"\n")
    base = _runner({str(wrapper): "13.0.88"})

    def run(argv, **kw):
        if argv[1] == "--dryrun":
            return _done(argv, err=f"#$ _NVVM_BRANCH_=nvvm\n#$ TOP={real.parent}/..\n#$ NVVMIR_LIBRARY_DIR=x\n")
        return base(argv)

    assert toolchain.nvcc_info(wrapper, runner=run).home == real.parent.parent


def _no_which(name, path=None):
    return None


def test_find_nvcc_prefers_cuda_home_and_reads_archs(tmp_path: Path) -> None:
    a = _fake_nvcc(tmp_path, "cuda-a")
    b = _fake_nvcc(tmp_path, "cuda-b")
    env = {"CUDA_HOME": str(a.parent.parent), "CUDA_PATH": str(b.parent.parent), "PATH": ""}
    got = toolchain.find_nvcc(env, runner=_runner({str(a): "12.8.93", str(b): "13.0.88"}), which=_no_which, fallback_dirs=())
    assert got.path == a and got.version == Version("12.8.93") and got.cuda == "12.8"
    assert "compute_90" in got.gpu_archs and "sm_90a" in got.gpu_codes
    assert got.supports(120) and not got.supports(70)
    assert got.env()["CUDA_HOME"] == str(a.resolve().parent.parent)


def test_find_nvcc_picks_the_requested_cuda(tmp_path: Path) -> None:
    a = _fake_nvcc(tmp_path, "cuda-a")
    b = _fake_nvcc(tmp_path, "cuda-b")
    env = {"CUDA_HOME": str(a.parent.parent), "PATH": str(b.parent)}
    def which(name, path=None):
        return str(b) if path == str(b.parent) else None

    got = toolchain.find_nvcc(env, cuda="13.0", runner=_runner({str(a): "12.8.93", str(b): "13.0.88"}), which=which, fallback_dirs=())
    assert got.path == b


def test_missing_cuda_version_says_what_to_do(tmp_path: Path) -> None:
    a = _fake_nvcc(tmp_path, "cuda-a")
    env = {"CUDA_HOME": str(a.parent.parent), "PATH": ""}
    run = _runner({str(a): "13.0.88"})
    with pytest.raises(ToolchainError) as err:
        toolchain.find_nvcc(env, cuda="12.9", runner=run, which=_no_which, fallback_dirs=())
    text = err.value.render()
    assert "CUDA 12.9 is not installed" in text and "13.0" in text and "no nvcc on PyPI" in text
    with pytest.raises(ToolchainError) as err13:
        toolchain.find_nvcc(env, cuda="13.1", runner=run, which=_no_which, fallback_dirs=())
    assert "nvidia-cuda-nvcc==13.1.*" in err13.value.render()


def test_no_nvcc_anywhere(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="no nvcc found"):
        toolchain.find_nvcc({"PATH": ""}, which=_no_which, fallback_dirs=(tmp_path,))


def test_broken_nvcc_is_a_toolchain_error(tmp_path: Path) -> None:
    a = _fake_nvcc(tmp_path, "cuda-a")
    with pytest.raises(ToolchainError, match="did not report a CUDA release"):
        toolchain.nvcc_info(a, runner=lambda argv, **kw: _done(argv, rc=1, err="segfault"))
    with pytest.raises(ToolchainError, match="not a CUDA version"):
        toolchain.find_nvcc({"CUDA_HOME": str(a.parent.parent), "PATH": ""}, cuda="thirteen",
                            runner=_runner({str(a): "13.0.88"}), which=_no_which, fallback_dirs=())


# ---------------------------------------------------------------------------- provisioning


def test_cuda_12_cannot_be_provisioned(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError) as err:
        toolchain.provision_cuda("12.8", tmp_path, runner=lambda *a, **k: pytest.fail("must not run pip"))
    assert "ptxas" in err.value.render() and "CUDA_HOME" in err.value.render()


def test_provision_requirements_pin_one_minor() -> None:
    assert toolchain.provision_requirements("13.0") == [
        "nvidia-cuda-nvcc==13.0.*", "nvidia-cuda-crt==13.0.*", "nvidia-cuda-runtime==13.0.*",
        "nvidia-nvvm==13.0.*", "nvidia-cuda-cccl==13.0.*",
    ]


def _pip_that_lays_out(version: str):
    calls = []

    def run(argv, **kw):
        if "pip" in argv:
            calls.append(argv)
            target = Path(argv[argv.index("--target") + 1])
            home = target / "nvidia" / "cu13"
            (home / "bin").mkdir(parents=True)
            (home / "lib").mkdir()
            (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
            return _done(argv)
        return _runner({argv[0]: version})(argv)

    return run, calls


def test_provision_installs_into_the_cache_with_lib64_link(tmp_path: Path) -> None:
    run, calls = _pip_that_lays_out("13.0.88")
    nvcc = toolchain.provision_cuda("13.0", tmp_path, runner=run, python="/usr/bin/python3")
    home = tmp_path / "cuda" / "13.0" / "nvidia" / "cu13"
    assert nvcc.path == home / "bin" / "nvcc" and nvcc.home == home and nvcc.cuda == "13.0"
    assert (home / "lib64").is_symlink() and (home / "lib64").resolve() == (home / "lib").resolve()
    assert calls and calls[0][0] == "/usr/bin/python3" and "nvidia-cuda-crt==13.0.*" in calls[0]
    assert not [p for p in (tmp_path / "cuda").iterdir() if p.name.startswith(".")]
    # second call: already there, no pip
    again = toolchain.provision_cuda("13.0", tmp_path, runner=lambda argv, **kw: (
        pytest.fail("pip ran again") if "pip" in argv else _runner({argv[0]: "13.0.88"})(argv)))
    assert again.path == nvcc.path


def test_failed_pip_leaves_nothing(tmp_path: Path) -> None:
    def run(argv, **kw):
        return _done(argv, rc=1, err="ERROR: No matching distribution found for nvidia-cuda-nvcc==13.9.*")

    with pytest.raises(ToolchainError) as err:
        toolchain.provision_cuda("13.9", tmp_path, runner=run)
    assert "No matching distribution" in err.value.render()
    assert list((tmp_path / "cuda").iterdir()) == []


def test_wrong_version_from_pypi_is_refused(tmp_path: Path) -> None:
    run, _ = _pip_that_lays_out("13.1.80")
    with pytest.raises(ToolchainError, match="not CUDA 13.0"):
        toolchain.provision_cuda("13.0", tmp_path, runner=run)


# ---------------------------------------------------------------------------- torch


def test_detect_torch_parses_the_probe() -> None:
    out = json.dumps({"version": "2.11.0+cu130", "cuda": "13.0", "abi": True})
    info = toolchain.detect_torch("/opt/py", runner=lambda argv, **kw: _done(argv, out="noise\n" + out + "\n"))
    assert info is not None
    assert info.version == Version("2.11.0") and info.local == "cu130" and info.cuda == "13.0"
    assert info.cxx11_abi and info.python == "/opt/py" and info.tag == "cu130torch2.11"
    cpu = toolchain.detect_torch("p", runner=lambda argv, **kw: _done(
        argv, out=json.dumps({"version": "2.9.1", "cuda": None, "abi": False})))
    assert cpu is not None and cpu.tag == "torch2.9" and not cpu.cxx11_abi


def test_detect_torch_absent_and_broken() -> None:
    assert toolchain.detect_torch("p", runner=lambda argv, **kw: _done(argv, out="null\n")) is None
    with pytest.raises(ToolchainError, match="failed while importing torch"):
        toolchain.detect_torch("p", runner=lambda argv, **kw: _done(argv, rc=1, err="ImportError: libcudart.so.13"))
    with pytest.raises(ToolchainError, match="cannot run the Python interpreter"):
        toolchain.detect_torch("/no/such/python")


# ---------------------------------------------------------------------------- compiler cache


def _which_from(found: dict[str, str]):
    return lambda name, path=None: found.get(name)


def test_no_cache_when_none_present_or_disabled(tmp_path: Path) -> None:
    assert toolchain.compiler_cache({"PATH": "/usr/bin"}, _which_from({}), wrapper_dir=tmp_path) is None
    found = _which_from({"ccache": "/usr/bin/ccache"})
    assert toolchain.compiler_cache({"PATH": "/usr/bin", "KFORGE_COMPILER_CACHE": "none"}, found,
                                    wrapper_dir=tmp_path) is None


def test_requested_cache_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="sccache is not on PATH"):
        toolchain.compiler_cache({"PATH": "", "KFORGE_COMPILER_CACHE": "sccache"}, _which_from({}), wrapper_dir=tmp_path)
    with pytest.raises(ToolchainError, match="not a compiler cache"):
        toolchain.compiler_cache({"PATH": "", "KFORGE_COMPILER_CACHE": "distcc"}, _which_from({}), wrapper_dir=tmp_path)


def test_ccache_setup_env_and_wrappers(tmp_path: Path) -> None:
    which = _which_from({"ccache": "/usr/bin/ccache", "sccache": "/x/sccache", "c++": "/usr/bin/c++",
                         "gcc": "/usr/bin/gcc", "nvcc": "/usr/local/cuda/bin/nvcc"})
    setup = toolchain.compiler_cache({"PATH": "/usr/bin:/bin"}, which, wrapper_dir=tmp_path / "w")
    assert setup is not None and setup.tool == "ccache"
    env = setup.env
    for key in ("CMAKE_C_COMPILER_LAUNCHER", "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER_LAUNCHER",
                "FLASHINFER_CXX_LAUNCHER", "FLASHINFER_NVCC_LAUNCHER"):
        assert env[key] == "/usr/bin/ccache"
    assert env["PATH"].split(":")[0] == str(tmp_path / "w")
    assert env["PYTORCH_NVCC"] == str(tmp_path / "w" / "nvcc")
    assert env["CCACHE_DEPEND"] == "1" and env["CCACHE_COMPILERCHECK"] == "content"
    wrapper = (tmp_path / "w" / "nvcc").read_text()
    config = nvccwrap.Config.from_json(shlex.split(wrapper.splitlines()[-1])[4])  # exec python -I boot CONFIG "$@"
    assert config.policy.mode == "off" and config.short_deps  # the cache's wrapper enforces nothing
    assert (config.launcher, config.nvcc) == ("/usr/bin/ccache", "/usr/local/cuda/bin/nvcc")
    assert "exec '/usr/bin/ccache' '/usr/bin/c++'" in (tmp_path / "w" / "c++").read_text()
    assert not (tmp_path / "w" / "cc").exists()  # no real cc found, no wrapper
    # the user's own settings win
    mine = toolchain.compiler_cache({"PATH": "/usr/bin", "CCACHE_NODEPEND": "1"}, which, wrapper_dir=tmp_path / "w2")
    assert mine is not None and "CCACHE_DEPEND" not in mine.env  # ccache refuses CCACHE_DEPEND=0


def test_sccache_when_chosen_and_no_nvcc(tmp_path: Path) -> None:
    which = _which_from({"sccache": "/x/sccache", "ccache": "/usr/bin/ccache"})
    setup = toolchain.compiler_cache({"PATH": "/x", "KFORGE_COMPILER_CACHE": "sccache"}, which, wrapper_dir=tmp_path)
    assert setup is not None and setup.tool == "sccache"
    assert "CCACHE_DEPEND" not in setup.env and "PYTORCH_NVCC" not in setup.env
    assert setup.nvcc_wrapper is None and setup.notes


def test_sccache_points_nvcc_at_the_real_host_compiler(tmp_path: Path) -> None:
    which = _which_from({"sccache": "/x/sccache", "c++": "/usr/bin/c++", "nvcc": "/usr/local/cuda/bin/nvcc"})
    setup = toolchain.compiler_cache({"PATH": "/usr/bin:/x", "KFORGE_COMPILER_CACHE": "sccache"}, which,
                                     wrapper_dir=tmp_path / "w")
    assert setup is not None and setup.env["NVCC_CCBIN"] == "/usr/bin/c++"  # not the c++ wrapper on PATH
    # CMake launches `<launcher> <compiler>`, and its compiler is often the c++ wrapper on PATH, which calls sccache
    # again: sccache cannot identify that ("Compiler not supported"), so the launcher swaps in the real compiler
    launcher = Path(setup.env["CMAKE_CXX_COMPILER_LAUNCHER"])
    assert launcher.parent == tmp_path / "w" and setup.env["FLASHINFER_CXX_LAUNCHER"] == str(launcher)
    log = tmp_path / "argv"
    fake = tmp_path / "fake-sccache"
    fake.write_text(f'#!/bin/sh\necho "$@" > {log}\n')
    fake.chmod(0o755)
    text = launcher.read_text().replace("'/x/sccache'", repr(str(tmp_path / "fake-sccache")))
    launcher.write_text(text)
    subprocess.run([str(launcher), str(tmp_path / "w" / "c++"), "-c", "a.cpp"], check=True)
    assert log.read_text().split() == ["/usr/bin/c++", "-c", "a.cpp"]
    subprocess.run([str(launcher), "/usr/local/cuda/bin/nvcc", "-c", "a.cu"], check=True)  # others pass as given
    assert log.read_text().split() == ["/usr/local/cuda/bin/nvcc", "-c", "a.cu"]
    assert (tmp_path / "w" / "c++").is_file()
    mine = toolchain.compiler_cache({"PATH": "/usr/bin:/x", "KFORGE_COMPILER_CACHE": "sccache",
                                     "NVCC_CCBIN": "/opt/gcc/bin/g++"}, which, wrapper_dir=tmp_path / "w2")
    assert mine is not None and "NVCC_CCBIN" not in mine.env  # the user's own choice stays
    ccache = toolchain.compiler_cache({"PATH": "/usr/bin"}, _which_from({"ccache": "/usr/bin/ccache",
                                                                        "c++": "/usr/bin/c++"}), wrapper_dir=tmp_path / "w3")
    assert ccache is not None and "NVCC_CCBIN" not in ccache.env  # ccache handles nvcc's c++ calls itself


def test_host_include_env_puts_cccl_first_for_cuda_13() -> None:
    assert toolchain.host_include_env("/cuda", "13.0") == {"CPLUS_INCLUDE_PATH": "/cuda/include/cccl"}
    assert toolchain.host_include_env("/cuda", Version("13.0.88"), "/mine:/other") == {
        "CPLUS_INCLUDE_PATH": "/cuda/include/cccl:/mine:/other"}
    assert toolchain.host_include_env("/cuda", "13.0", "/x:/cuda/include/cccl") == {
        "CPLUS_INCLUDE_PATH": "/x:/cuda/include/cccl"}  # never twice
    assert toolchain.host_include_env("/cuda", "12.9") == {}  # CCCL still in include/ before 13


def test_nvcc_env_adds_cccl_only_where_the_toolkit_has_it(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    nvcc = toolchain.Nvcc(home / "bin" / "nvcc", home, Version("13.0.88"), frozenset())
    assert "CPLUS_INCLUDE_PATH" not in nvcc.env()
    (home / "include" / "cccl").mkdir()
    assert nvcc.env({"CPLUS_INCLUDE_PATH": "/mine"})["CPLUS_INCLUDE_PATH"] == f"{home}/include/cccl:/mine"
