"""The whole chain, for real: a fixture upstream as a git submodule with a patch series, and our fmha kernel.

plan -> source (pinned submodule export) -> patches (atomic) -> build (real nvcc) -> repair (auditwheel)
-> doctor -> report -> publish (manifest + PEP 503 index) -> pip install from that index.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import make_tiny_monorepo  # noqa: E402
from kforge_testkit import kforge  # noqa: E402

from kforge.errors import DoctorError  # noqa: E402

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KNOBS = """arch_knobs = [{{ env = "TINY_CUDA_ARCHS", format = "{fmt}" }}]
backend = "native"
build_isolation = false
env = {{ TINY_NVCC_FLAGS = "-O0" }}
"""


@pytest.fixture()
def mono(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return make_tiny_monorepo(tmp_path, monkeypatch)


def test_fixture_upstream_through_the_whole_chain(mono) -> None:
    root, env = mono
    with (root / "forge.toml").open("a") as fh:
        fh.write(KNOBS.format(fmt="cmake"))  # renders sm_90a as "90a": TINY_CUDA_ARCHS keeps the variant
    wheelhouse = root / "wheelhouse"
    out = kforge("build", "tiny-sm90", "--wheelhouse", str(wheelhouse), "--no-progress", cwd=root, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "applied 0001-setup-build-sm_120-by-default.patch" in out.stderr
    assert "0003" not in out.stderr  # platform=windows: not selected on Linux
    assert "0004" not in out.stderr  # arch>=sm_120: not selected for sm_90a

    (wheel,) = (wheelhouse / "tiny").glob("*.whl")
    assert "manylinux" in wheel.name  # auditwheel repaired it
    manifest = json.loads(Path(str(wheel) + ".manifest.json").read_text())
    assert manifest["target"] == "tiny-sm90"
    assert manifest["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert manifest["archs"] == ["sm_90a"] and manifest["source_kind"] == "git"
    assert len(manifest["source_pin"]) == 40 and manifest["patch_series_hash"]
    assert manifest["patches"] == ["0001-setup-build-sm_120-by-default.patch", "0002-tiny.cu-256-threads-per-block.patch"]
    sass = {f["arch"] for b in manifest["doctor"]["binaries"] for f in b["fatbins"] if f["kind"] == "sass"}
    assert sass == {"sm_90a"}
    assert manifest["toolchain"]["nvcc"].startswith("13.0")
    assert any(a.endswith("timeline.html") for a in manifest["attachments"])
    assert (root / ".git").is_dir() and not (root / "externals" / "tiny" / "build").exists()  # checkout stays pristine

    page = (wheelhouse / "simple" / "tiny-upstream" / "index.html").read_text()
    assert f"#sha256={manifest['sha256']}" in page
    # The patched source really went into the binary: 0002 changed the block size constant.
    with zipfile.ZipFile(wheel) as zf:
        assert any(n.startswith("tiny_upstream/_tiny") for n in zf.namelist())


def test_missing_arch_fails_the_build_and_publishes_nothing(mono) -> None:
    root, env = mono
    with (root / "forge.toml").open("a") as fh:
        # arch_enforce = "off": kforge's nvcc wrapper would otherwise rewrite the upstream's sm_80 to the plan's sm_90a
        fh.write(KNOBS.format(fmt="cmake") + 'arch_enforce = "off"\n')
    wheelhouse = root / "wheelhouse"
    # The build ends up with other archs than the target's (an override, or an upstream that ignores its knob):
    # plain sm_80 SASS, which an H100 cannot run.
    out = kforge("build", "tiny-sm90", "--env", "TINY_CUDA_ARCHS=80", "--wheelhouse", str(wheelhouse), "--no-progress",
                 cwd=root, env=env)
    assert out.returncode == DoctorError.exit_code, out.stdout + out.stderr
    assert "sm_90a" in out.stderr and "no kernel image is available" in out.stderr and "_tiny" in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(wheelhouse.glob("**/*.whl"))


def test_builds_of_different_arch_sets_leave_distinct_wheels(mono) -> None:
    """One arch, then two in one build (tiny-sm90+sm120): both wheels stay in the wheelhouse and the index."""
    root, env = mono
    with (root / "forge.toml").open("a") as fh:
        fh.write(KNOBS.format(fmt="cmake"))
    wheelhouse = root / "wheelhouse"
    for target in ("tiny-sm90", "tiny-sm120+sm90"):
        out = kforge("build", target, "--wheelhouse", str(wheelhouse), "--no-progress", cwd=root, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
    wheels = sorted(w.name for w in (wheelhouse / "tiny").glob("*.whl"))
    assert [w.split("-")[1] for w in wheels] == ["0.1.0+sm90a", "0.1.0+sm90a.sm120a"]
    fat = json.loads(Path(str(wheelhouse / "tiny" / wheels[1]) + ".manifest.json").read_text())
    assert fat["target"] == "tiny-sm90+sm120" and fat["archs"] == ["sm_90a", "sm_120a"]
    sass = {f["arch"] for b in fat["doctor"]["binaries"] for f in b["fatbins"] if f["kind"] == "sass"}
    assert sass == {"sm_90a", "sm_120a"}
    page = next((wheelhouse / "simple").glob("*/index.html")).read_text()
    assert all(w in page for w in wheels)


def test_variant_the_knob_cannot_carry_is_refused_at_plan_time(mono) -> None:
    root, env = mono
    with (root / "forge.toml").open("a") as fh:
        fh.write(KNOBS.format(fmt="numbers"))  # "90a" would be rendered as "90": the wheel would lack sm_90a
    out = kforge("build", "tiny-sm90", "--wheelhouse", str(root / "wh"), cwd=root, env=env)
    assert out.returncode == 3, out.stderr
    assert "takes plain arch numbers" in out.stderr and "Traceback" not in out.stderr
    assert not (root / ".kforge" / "work" / "tiny-sm90").exists()  # refused before any work


def test_dirty_submodule_is_refused_before_building(mono) -> None:
    root, env = mono
    (root / "externals" / "tiny" / "csrc" / "tiny.cu").write_text("// edited in place\n")
    out = kforge("build", "tiny-sm90", "--wheelhouse", str(root / "wh"), cwd=root, env=env)
    assert out.returncode == 5, out.stderr
    assert "dirty" in out.stderr and "--allow-dirty" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture(scope="session")
def fmha_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job's output. `nox -s tests` builds it once and passes it in; otherwise build it here."""
    given = os.environ.get("KFORGE_TEST_WHEELHOUSE")
    if given:
        return Path(given)
    wh = tmp_path_factory.mktemp("wheelhouse")
    out = kforge("build", "fmha-sm90", "--wheelhouse", str(wh), "--no-progress", cwd=ROOT, env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    return wh


def test_fmha_main_job_wheel(fmha_wheelhouse: Path, tmp_path: Path) -> None:
    (wheel,) = (fmha_wheelhouse / "fmha").glob("kforge_fmha-*.whl")
    # the arch label keeps it apart from other fmha builds (kforge.config.wheelname); fmha-release has none
    assert wheel.name.startswith("kforge_fmha-0.1.0+sm90a-py3-none-manylinux_") and wheel.name.endswith("_x86_64.whl")
    manifest = json.loads(Path(str(wheel) + ".manifest.json").read_text())
    assert manifest["target"] == "fmha-sm90" and manifest["source_kind"] == "local"
    binaries = manifest["doctor"]["binaries"]
    assert any("libkforge_fmha" in b["path"] for b in binaries)
    sass = {f["arch"] for b in binaries for f in b["fatbins"] if f["kind"] == "sass"}
    assert sass == {"sm_90a"}
    assert not any(b["linked_binary_symbols"] for b in binaries if "linked_binary_symbols" in b)
    needed = {n for b in binaries for n in b.get("needed", [])}
    assert not any(n.startswith(("libcudart", "libtorch", "libc10")) for n in needed)  # static cudart, torch-free

    # A user's install: real pip, a fresh venv, only our index.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    index = (fmha_wheelhouse / "simple").as_uri()
    pip = subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", "--index-url", index, "kforge-fmha"],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = subprocess.run([str(py), "-c", "import kforge_fmha, sys; print(kforge_fmha.__version__)"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert probe.returncode == 0 and probe.stdout.strip() == "0.1.0", probe.stderr


def test_fmha_c_library_through_the_cmake_backend(tmp_path: Path) -> None:
    """The standalone C API: configured and built by CMake, checked by the doctor, not published as a wheel."""
    env = dict(os.environ, KFORGE_CACHE=str(tmp_path / "cache"))
    out = kforge("build", "fmha-sm90", "--backend", "cmake", "--wheelhouse", str(tmp_path / "wh"), "--no-progress",
                 cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "libkforge_fmha.so.0.1.0: has sm_90a" in out.stderr
    archive = Path(out.stdout.splitlines()[0].split(": ", 1)[1])
    assert archive.name == "fmha-sm90.tar.gz" and archive.is_file()
    assert not (tmp_path / "wh").exists()  # nothing in the wheelhouse: it indexes wheels only
