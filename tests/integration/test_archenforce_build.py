"""Arch enforcement for real: an upstream that hard-codes sm_75/80/90 (setup.py -gencode, CMakeLists.txt
CMAKE_CUDA_ARCHITECTURES), declared by forge.toml alone, built with real nvcc and cmake.

* ``arch_enforce = "on"``: ``kforge build gencode-sm90`` yields a wheel whose doctor JSON lists sm_90 code only,
  and the build report says what the wrapper rewrote.
* ``arch_enforce = "check"``: the wrapper changes nothing, so the binaries carry three archs; the build's
  exact doctor fails naming the binary and the extra arch, publishes nothing, and the standalone
  ``kforge doctor --exact`` fails the same wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gencode import make_mono  # noqa: E402

from kforge.errors import DoctorError  # noqa: E402

pytestmark = pytest.mark.integration
SRC = Path(__file__).resolve().parents[2] / "src"


def kforge(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture()
def env(nvcc_env_and_host, tmp_path: Path) -> dict[str, str]:
    environ, _host = nvcc_env_and_host
    if not shutil.which("cmake", path=environ.get("PATH")):
        pytest.skip("cmake is not installed (apt-get install cmake): the fixture's second library is built by CMake")
    out = dict(environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), environ.get("PYTHONPATH", "")) if p)
    out["KFORGE_CACHE"] = str(tmp_path / "cache")
    out["KFORGE_COMPILER_CACHE"] = "none"  # the real compile, not a cache hit
    return out


def _codes(doctor: dict) -> dict[str, tuple[set[str], set[str]]]:
    return {b["path"].rsplit("/", 1)[-1].split(".")[0]: (set(b["sass_archs"]), set(b["ptx_archs"]))
            for b in doctor["binaries"] if b["fatbins"]}


def test_hard_coded_archs_are_rewritten_to_the_plans(env: dict[str, str], tmp_path: Path) -> None:
    root = make_mono(tmp_path / "mono", mode="on")
    plan = kforge("plan", "gencode-sm90", cwd=root, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "holds exactly SASS sm_90, PTX compute_90" in plan.stdout
    assert "will rewrite where they differ: CMakeLists.txt:5: set(CMAKE_CUDA_ARCHITECTURES 75 80 90)" in plan.stdout

    out = kforge("build", "gencode-sm90", "--wheelhouse", str(root / "wh"), "--no-progress", cwd=root, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (root / "wh" / "gencode").glob("*.whl")
    manifest = json.loads(Path(str(wheel) + ".manifest.json").read_text())
    # both libraries, the one nvcc built directly and the one CMake built, carry sm_90 code only
    assert _codes(manifest["doctor"]) == {"_direct": ({"sm_90"}, {"compute_90"}), "_cmake": ({"sm_90"}, {"compute_90"})}
    assert manifest["doctor"]["judged_by"]["exact"] is True
    assert "rewrote 1 nvcc step(s) that asked for sm_75 sm_80 sm_90 to sm_90 compute_90" in out.stderr
    assert "rewrote --threads 4 to" in out.stderr
    report = json.loads((root / ".kforge" / "work" / "gencode-sm90" / "report" / "report.json").read_text())
    asked = [set(g["asked"]) for g in report["arch_enforcement"]["archs"]]
    assert {"sm_75", "sm_80", "sm_90"} in asked  # setup.py's -gencode list
    assert any({"sm_75", "compute_75"} <= a for a in asked)  # CMake's "75;80;90" (SASS+PTX each)

    # the doctor run on its own judges the published wheel as the build did (policy, exact archs)
    alone = kforge("doctor", str(wheel), "--json", cwd=root, env=env)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert json.loads(alone.stdout)["ok"] is True

    # strip_debug (the default): the repair step looked (this fixture builds without -g: nothing to strip; real
    # stripping is tests/integration/test_repair_real.py's), the doctor checked, and the manifest says so
    assert manifest["doctor"]["judged_by"]["stripped"] is True
    assert "strip_debug: no binary of the wheel has host debug info" in out.stderr

    # --ptx none: the wrapper gives every step SASS only, whatever it asked (CMake's 90 means SASS + PTX to nvcc)
    none = kforge("build", "gencode-sm90", "--ptx", "none", "--wheelhouse", str(root / "wh-none"), "--no-progress",
                  cwd=root, env=env)
    assert none.returncode == 0, none.stdout + none.stderr
    (bare,) = (root / "wh-none" / "gencode").glob("*.whl")
    doctor = json.loads(Path(str(bare) + ".manifest.json").read_text())["doctor"]
    assert _codes(doctor) == {"_direct": ({"sm_90"}, set()), "_cmake": ({"sm_90"}, set())}
    assert doctor["judged_by"]["expect"] == ["sm_90"] and doctor["judged_by"]["exact_ptx"] is True


def test_exact_doctor_fails_a_real_multi_arch_build(env: dict[str, str], tmp_path: Path) -> None:
    root = make_mono(tmp_path / "mono", mode="check")  # report, don't rewrite: the upstream's three archs go in
    out = kforge("build", "gencode-sm90", "--wheelhouse", str(root / "wh"), "--no-progress", cwd=root, env=env)
    assert out.returncode == DoctorError.exit_code, out.stdout + out.stderr
    assert "would rewrite (check mode) 1 nvcc step(s) that asked for sm_75 sm_80 sm_90" in out.stderr
    assert "_direct.cpython" in out.stderr and "carries SASS sm_75, which the plan did not ask for" in out.stderr
    assert "Traceback" not in out.stderr
    assert not list((root / "wh").glob("**/*.whl"))  # nothing published

    (wheel,) = (root / ".kforge" / "work" / "gencode-sm90" / "repaired").glob("*.whl")
    exact = kforge("doctor", str(wheel), "--expect-arch", "sm_90,compute_90", "--exact", "--json", cwd=root, env=env)
    assert exact.returncode == DoctorError.exit_code
    errors = [f for f in json.loads(exact.stdout)["findings"] if f["severity"] == "error"]
    extra = {(f["binary"].rsplit("/", 1)[-1].split(".")[0], f["arch"]) for f in errors if f["code"] == "extra-arch"}
    assert {("_direct", "sm_75"), ("_direct", "sm_80"), ("_cmake", "sm_75"), ("_cmake", "sm_80")} <= extra
    # without --exact the same wheel passes: nothing the plan asked for is missing
    loose = kforge("doctor", str(wheel), "--expect-arch", "sm_90", "--json", cwd=root, env=env)
    assert loose.returncode == 0, loose.stdout
