"""cibuildwheel for real, in kforge's own Debian bullseye image (podman, no registry), and the platform-tag policy.

The image takes minutes to make the first time (debootstrap, compilers, nvcc from PyPI) and is reused after
that: podman keeps it under a name that hashes its inputs. .ci/run installs podman, runc and debootstrap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import make_tiny_monorepo  # noqa: E402

from kforge.build import image  # noqa: E402
from kforge.errors import RepairError  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
MISSING = [t for t in ("podman", "debootstrap") if not shutil.which(t)]


def kforge(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1800)


needs_podman = pytest.mark.skipif(bool(MISSING), reason=f"needs {' and '.join(MISSING)} (apt-get install podman runc "
                                                          "debootstrap; .ci/run installs them)")


@pytest.fixture(scope="module")
def fmha_in_bullseye(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """fmha-sm90 built by cibuildwheel in kforge:bullseye: (wheelhouse, the environment kforge ran with)."""
    tmp = tmp_path_factory.mktemp("bullseye")
    wh = tmp / "wh"
    env = dict(os.environ, KFORGE_CACHE=str(tmp / "cache"))
    out = kforge("build", "fmha-sm90", "--backend", "cibuildwheel", "--image", "kforge:bullseye", "--wheelhouse",
                 str(wh), "--no-progress", cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return wh, env


@needs_podman
def test_fmha_built_by_cibuildwheel_in_the_bullseye_image_is_manylinux_2_31(fmha_in_bullseye, tmp_path: Path) -> None:
    wh, _ = fmha_in_bullseye
    (wheel,) = (wh / "fmha").glob("kforge_fmha-*.whl")
    # The image's glibc (2.31), not the host's (2.36); auditwheel also lists the older tags the binary satisfies.
    assert wheel.name.endswith("manylinux_2_31_x86_64.whl") and "manylinux_2_3" not in wheel.name.replace("2_31", ""), wheel.name
    manifest = json.loads(Path(str(wheel) + ".manifest.json").read_text())
    sass = {f["arch"] for b in manifest["doctor"]["binaries"] for f in b["fatbins"] if f["kind"] == "sass"}
    assert sass == {"sm_90a"}  # the doctor checked what the container built

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", "--index-url", (wh / "simple").as_uri(),
                          "kforge-fmha"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = subprocess.run([str(py), "-c", "import kforge_fmha; print(kforge_fmha.__version__)"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert probe.returncode == 0 and probe.stdout.strip() == "0.1.0", probe.stderr


@needs_podman
def test_the_published_fmha_wheel_installs_and_imports_on_debian_bullseye(fmha_in_bullseye) -> None:
    """Issue 33 item 4: the published wheel, installed by pip from the wheelhouse's index inside a bullseye container
    (glibc 2.31, Debian's CPython 3.9, no network), imports there. No GPU: the import loads no CUDA library."""
    wh, env = fmha_in_bullseye
    penv = image.podman_env(Path(env["KFORGE_CACHE"]), env)
    ref = image.parse_image_name("kforge:bullseye", "13.0", ca_bundle=image.host_ca_bundle(env)).ref
    script = ("set -e; ldd --version | head -n1; cd /tmp; "
              "/opt/python/cp39-cp39/bin/python -m pip install -q --no-index --find-links /wh/fmha kforge-fmha; "
              "/opt/python/cp39-cp39/bin/python -c 'import kforge_fmha; print(kforge_fmha.__version__)'")
    out = subprocess.run(["podman", "run", "--rm", "--network=none", "--volume", f"{wh}:/wh:ro", ref, "bash", "-c",
                          script], env=penv, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert "2.31" in lines[0] and lines[-1] == "0.1.0", out.stdout


def test_a_wheel_newer_than_the_platform_tag_fails_naming_the_symbols(tmp_path, monkeypatch) -> None:
    """A native build on this host (glibc 2.36) held to manylinux_2_17 (--platform-tag): repair refuses, naming
    versions. The project's own platform_tag, a release floor, makes this a development build instead."""
    root, env = make_tiny_monorepo(tmp_path, monkeypatch)
    with (root / "forge.toml").open("a") as fh:
        fh.write('arch_knobs = [{ env = "TINY_CUDA_ARCHS", format = "cmake" }]\nbackend = "native"\n'
                 'build_isolation = false\nplatform_tag = "manylinux_2_17"\n')
    plan = kforge("plan", "tiny-sm90", cwd=root, env=env)
    # the project's floor is above what this host can reach natively: the plan says so and enforces nothing
    assert "the best tag the binaries allow (this host's glibc" in plan.stdout, plan.stdout + plan.stderr
    assert "release floor manylinux_2_17" in plan.stdout
    plan = kforge("plan", "tiny-sm90", "--platform-tag", "manylinux_2_17", cwd=root, env=env)
    assert "platform    manylinux_2_17" in plan.stdout, plan.stdout + plan.stderr  # the plan says it first
    wh = tmp_path / "wh"
    out = kforge("build", "tiny-sm90", "--platform-tag", "manylinux_2_17", "--wheelhouse", str(wh), "--no-progress",
                 cwd=root, env=env)
    assert out.returncode == RepairError.exit_code, out.stdout + out.stderr
    assert "cannot be a manylinux_2_17 wheel" in out.stderr and "Traceback" not in out.stderr
    assert "needs GLIBC_2." in out.stderr and "from libc.so.6 (the tag allows up to GLIBC_2.17)" in out.stderr
    assert "--image kforge:bullseye" in out.stderr  # and what to do about it
    assert not list(wh.glob("**/*.whl"))  # nothing published
