"""Shared test setup: the GPU rule (skip without a GPU, fail instead when KFORGE_REQUIRE_GPU=1), and shared fixtures.

The forge.toml builder and the ``kforge()`` CLI runner live in tests/fixtures/kforge_testkit.py;
``forge_and_plan`` turns such a forge.toml into plans on a fixed, fake host.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))  # kforge_testkit, kforge_gitfixtures, kforge_doctor_builders

from kforge_testkit import CACHE_VARIABLES  # noqa: E402

from kforge.build.host import HostFacts, Resources, detect_host  # noqa: E402
from kforge.build.profiles import load_profile  # noqa: E402
from kforge.config.forge import load_forge  # noqa: E402
from kforge.config.options import OPTIONS  # noqa: E402
from kforge.config.targets import parse_target  # noqa: E402
from kforge.cuda.arch import parse_arch  # noqa: E402
from kforge.plan import PlanOptions, make_plan  # noqa: E402


@functools.cache
def gpu_name() -> str | None:
    """The first GPU as nvidia-smi names it, or None. No torch needed."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out.strip() else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None or gpu_name():
        return
    if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
        pytest.fail("KFORGE_REQUIRE_GPU=1 but this machine has no NVIDIA GPU (nvidia-smi found none)", pytrace=False)
    pytest.skip("no NVIDIA GPU on this machine (nvidia-smi found none); KFORGE_REQUIRE_GPU=1 makes this a failure")


#: kforge's build options (the KFORGE_* of kforge.config.options) and its compiler-cache choice, as a used
#: machine's shell may set them; KFORGE_TEST_WHEELHOUSE, KFORGE_REQUIRE_GPU and KFORGE_FMHA_* are the suite's own.
MACHINE_SETTINGS = frozenset({o.env for o in OPTIONS} | {"KFORGE_COMPILER_CACHE", "KFORGE_DEBUG", "KFORGE_STATUS_FILE"})


@pytest.fixture(scope="session", autouse=True)
def own_caches(tmp_path_factory: pytest.TempPathFactory):
    """The session's caches, empty at its start: a used developer machine and a fresh CI machine run the same suite.

    Set in os.environ, so the tools and the kforge processes the tests start inherit them; a test that wants a
    cache of its own still passes its own folder.
    """
    base = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name in MACHINE_SETTINGS or name.startswith(("SCCACHE_", "CCACHE_", "UV_")):
                mp.delenv(name)  # a machine's build options, remote cache or index never reach the tests
        for name, sub in CACHE_VARIABLES.items():
            mp.setenv(name, str(base / sub))
        mp.setenv("CCACHE_CONFIGPATH", str(base / "ccache.conf"))  # not the machine's ~/.config/ccache
        mp.setenv("UV_NO_CONFIG", "1")
        # an sccache client reaches its daemon by port: never a machine's daemon (4226) with that daemon's cache
        mp.setenv("SCCACHE_SERVER_PORT", str(_free_port()))
        yield base


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def nvcc() -> str:
    """The nvcc the real-build tests compile with (CUDA_HOME, PATH or /usr/local/cuda*)."""
    import kforge_doctor_builders

    found = kforge_doctor_builders.find_nvcc()
    if not found:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return found


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the doctor/repair fixtures' real builds, shared by the whole session (they are cached)."""
    return tmp_path_factory.getbasetemp() / "kforge-doctor-fixtures"


@pytest.fixture(scope="session")
def nvcc_env_and_host():
    """The environment and host facts a real build sees; skips where no nvcc is found."""
    environ = dict(os.environ)
    if not environ.get("CUDA_HOME") and Path("/usr/local/cuda-13.0/bin/nvcc").is_file():
        environ["CUDA_HOME"] = "/usr/local/cuda-13.0"
    host = detect_host(environ, probe_torch=False)
    if host.nvcc_path is None:
        pytest.skip("no nvcc found (set CUDA_HOME): these tests compile real CUDA")
    return environ, host


@pytest.fixture()
def forge_and_plan():
    """``setup(root, forge_toml_text, gpu_arch=None)`` writes forge.toml and returns ``make(target, **options)``,
    which gives ``(plan, host)`` for a fixed fake Linux host (2 cpus, 16 GiB free, nvcc 13.0 at /opt/cuda)."""
    def setup(root: Path, text: str, *, gpu_arch: str | None = None):  # type: ignore[no-untyped-def]
        (root / "forge.toml").write_text(text)
        forge = load_forge(root)
        host = HostFacts(platform="linux-x86_64", python="3.11", resources=Resources(2, 16 * 2**30, 24 * 2**30),
                         cuda_version=Version("13.0"), nvcc_path="/opt/cuda/bin/nvcc", cuda_home="/opt/cuda",
                         gpu_arch=parse_arch(gpu_arch) if gpu_arch else None,
                         gpu_name=f"fake {gpu_arch} GPU" if gpu_arch else None)

        def make(target: str, **options):  # type: ignore[no-untyped-def]
            t = parse_target(forge, target, host.platform)
            profile = load_profile(root / "cache", t.project, 1)
            return make_plan(forge, t, host, PlanOptions(**options), job_profile=profile), host
        return make
    return setup
