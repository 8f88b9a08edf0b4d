"""`kforge release fmha` on this CPU machine: forge.toml's fmha matrix (sm_90a, sm_80 x one CUDA 13.0 variant) is
built into one wheelhouse with a release manifest, and a second run skips every build (identical inputs)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _release(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", "release", "fmha", *args, "--no-progress"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)


def test_release_fmha_builds_the_matrix_then_skips_it(tmp_path: Path) -> None:
    wh = tmp_path / "wheelhouse"
    env = dict(os.environ, KFORGE_WHEELHOUSE=str(wh), KFORGE_CACHE=str(tmp_path / "cache"))
    env.pop("SOURCE_DATE_EPOCH", None)

    # forge.toml's floor for fmha is manylinux_2_31: on a newer host the release builds in kforge:bullseye. That
    # route is shown here (a dry run builds nothing); the builds below keep CI's time by raising the floor to this
    # host's glibc (the image route's build is tested in test_image_build.py).
    floor = _release("--dry-run", env=env)
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    if tuple(map(int, glibc.split("."))) > (2, 31) and shutil.which("podman") and shutil.which("debootstrap"):
        assert floor.returncode == 0, floor.stdout + floor.stderr
        assert "platform floor: cibuildwheel in kforge:bullseye" in floor.stdout, floor.stdout
    env["KFORGE_PLATFORM_TAG"] = "manylinux_" + glibc.replace(".", "_")

    dry = _release("--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "fmha-sm90" in dry.stdout and "fmha-sm80" in dry.stdout and "2 to build, 0 already published" in dry.stdout
    assert "unknown" in dry.stdout  # a fresh cache has measured nothing
    assert not wh.exists()  # --dry-run builds and writes nothing

    first = _release(env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "built 2, skipped 0" in first.stdout
    manifest = json.loads((wh / "releases" / "fmha.json").read_text())
    wheels = {w["target"]: w for w in manifest["wheels"]}
    assert set(wheels) == {"fmha-sm90", "fmha-sm80"}
    for target, w in wheels.items():
        path = wh / w["wheel"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == w["sha256"]
        assert w["doctor"] == "ok" and w["variant"].startswith("cu130-cp") and not w["skipped"]
        # the build's wall time and each pipeline step's, as measured by this run
        assert {"preflight", "source", "toolchain", "build", "repair", "doctor", "publish"} <= set(w["steps"])
        assert w["wall_seconds"] >= w["steps"]["build"] > 0 and w["build_seconds"] > 0
        assert w["gpu_tests"]["status"] == "not run"
        assert path.name.startswith("kforge_fmha-0.1.0+" + target.split("-")[1])  # one wheel name per arch
    # one index: both wheels, also in the per-CUDA one, with PEP 691 JSON
    page = json.loads((wh / "cu130" / "simple" / "kforge-fmha" / "index.v1_json").read_text())
    assert sorted(f["filename"] for f in page["files"]) == sorted(Path(w["wheel"]).name for w in wheels.values())

    again = _release(env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "0 to build, 2 already published" in again.stdout and "built 0, skipped 2" in again.stdout
    assert "==> " not in again.stderr  # no build step ran
    second = json.loads((wh / "releases" / "fmha.json").read_text())
    assert [(w["wheel"], w["sha256"], w["skipped"]) for w in second["wheels"]] == [
        (w["wheel"], w["sha256"], True) for w in manifest["wheels"]]
    assert all(w["steps"] is None and w["build_seconds"] > 0 for w in second["wheels"])  # nothing ran this time
    # the second dry run prices nothing and says why (measured unit times now exist)
    assert "nothing to build" in _release("--dry-run", env=env).stdout

    # part of the matrix with its GPU tests: nothing to build; on this machine (no GPU) the tests are skipped, and
    # the manifest records that next to the doctor's verdict, with the sm_80 entry kept from the full run
    env.pop("KFORGE_REQUIRE_GPU", None)
    if shutil.which("nvidia-smi"):
        pytest.skip("the rest checks the no-GPU path (skip, then KFORGE_REQUIRE_GPU=1 failing); this machine has nvidia-smi")
    part = _release("--only", "sm_90a", "--gpu-tests", env=env)
    assert part.returncode == 0, part.stdout[-3000:] + part.stderr[-3000:]
    assert "(--only sm_90a: 1 of the matrix's 2)" in part.stdout and "GPU tests: 1 skipped" in part.stdout
    third = json.loads((wh / "releases" / "fmha.json").read_text())
    assert third["selection"] == ["sm_90a"] and third["complete"] is True
    tested = {w["target"]: w["gpu_tests"] for w in third["wheels"]}
    assert tested["fmha-sm90"]["status"] == "skipped" and "no NVIDIA GPU" in tested["fmha-sm90"]["reason"]
    assert tested["fmha-sm80"]["status"] == "not run"  # kept from the full run
    # KFORGE_REQUIRE_GPU=1 turns the skip into a failure: recorded, and a non-zero exit
    strict = _release("--only", "sm_90a", "--gpu-tests", env=dict(env, KFORGE_REQUIRE_GPU="1"))
    assert strict.returncode == 12, strict.stdout[-3000:] + strict.stderr[-3000:]
    assert "Traceback" not in strict.stderr and "did not pass" in strict.stderr
    failed = {w["target"]: w["gpu_tests"] for w in json.loads((wh / "releases" / "fmha.json").read_text())["wheels"]}
    assert failed["fmha-sm90"]["status"] == "error"
    # an --only that names nothing: a clear error listing the builds, exit code 2, nothing written
    none = _release("--only", "sm_86", env=env)
    assert none.returncode == 2 and "matches no build" in none.stderr and "sm_90a/cu130-cp" in none.stderr
