"""The wheelhouse with real pip (file:// and python -m http.server), a SIGKILLed publisher, and two at once."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.wheels import wheelhouse
from kforge.wheels.wheelhouse import Manifest

pytestmark = pytest.mark.integration

NAME = "kforge-wh-probe"  # a name no index has


def _pip_env(tmp: Path) -> dict[str, str]:
    """pip with no user/global configuration (this host's pip.conf adds extra indexes and find-links)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               HOME=str(tmp), PYTHONNOUSERSITE="1")
    return env


def _build_wheel(tmp: Path, version: str) -> Path:
    """A real wheel from a tiny setuptools project, built by pip itself (offline)."""
    src = tmp / f"src-{version}"
    (src / "kforge_wh_probe").mkdir(parents=True)
    (src / "kforge_wh_probe" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "setup.py").write_text(
        f"from setuptools import setup\nsetup(name={NAME!r}, version={version!r}, packages=['kforge_wh_probe'])\n"
    )
    out = tmp / f"dist-{version}"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(out), str(src)], env=_pip_env(tmp), check=True, capture_output=True, text=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def _manifest(version: str) -> Manifest:
    return Manifest(target="probe-sm90", project="probe", source_kind="local", source_pin=version,
                    toolchain={"nvcc": None, "torch": None, "python": sys.version.split()[0]})


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wheels")
    return {v: _build_wheel(tmp, v) for v in ("1.0.0", "1.1.0", "1.2.0")}


def _fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
    return path / "bin" / "python"


def _install_and_import(python: Path, index_url: str, tmp: Path) -> str:
    out = subprocess.run([str(python), "-m", "pip", "install", "--index-url", index_url, NAME],
                         env=_pip_env(tmp), capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    got = subprocess.run([str(python), "-c", "import kforge_wh_probe as m; print(m.VERSION)"],
                         capture_output=True, text=True, check=True)
    return got.stdout.strip()


def test_pip_installs_from_file_url_and_http_server(wheels: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "wheelhouse"
    for version in ("1.0.0", "1.1.0"):
        wheelhouse.publish(root, "probe", wheels[version], _manifest(version))
    # file://
    py1 = _fresh_venv(tmp_path / "venv-file")
    assert _install_and_import(py1, (root / "simple").as_uri() + "/", tmp_path) == "1.1.0"
    # python -m http.server serving the wheelhouse root
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0", "--directory",
                               str(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        port = int(re.search(r"port (\d+)", line).group(1))  # type: ignore[union-attr]
        py2 = _fresh_venv(tmp_path / "venv-http")
        assert _install_and_import(py2, f"http://127.0.0.1:{port}/simple/", tmp_path) == "1.1.0"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    # pip checked the #sha256= fragment: a wheel whose bytes no longer match is refused
    victim = root / "probe" / wheels["1.1.0"].name
    data = bytearray(victim.read_bytes())
    data[-30] ^= 0xFF
    victim.write_bytes(bytes(data))
    bad = subprocess.run([str(py1), "-m", "pip", "install", "--force-reinstall", "--index-url",
                          (root / "simple").as_uri() + "/", f"{NAME}==1.1.0"], env=_pip_env(tmp_path),
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode != 0 and "HASHES" in (bad.stdout + bad.stderr).upper()


_PUBLISHER = """
import sys
from pathlib import Path
from kforge.wheels import wheelhouse
from kforge.wheels.wheelhouse import Manifest
root, wheel, version = sys.argv[1:4]
t0 = __import__("time").time()
wheelhouse.publish(Path(root), "probe", Path(wheel), Manifest(target="probe-sm90", source_pin=version))
print(f"{t0} {__import__('time').time()}")
"""


def _index_is_consistent(root: Path) -> list[str]:
    """Every link of every index page points at a complete file whose sha256 matches; return the files."""
    files = []
    for page in (root / "simple").glob("*/index.html"):
        for href in re.findall(r'href="([^"]+)"', page.read_text()):
            rel, _, frag = href.partition("#sha256=")
            target = (page.parent / rel).resolve()
            assert target.is_file(), f"{page} links to missing {rel}"
            assert hashlib.sha256(target.read_bytes()).hexdigest() == frag
            files.append(target.name)
    return sorted(files)


def test_sigkilled_publisher_leaves_no_half_wheel(wheels: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "wheelhouse"
    wheelhouse.publish(root, "probe", wheels["1.0.0"], _manifest("1.0.0"))
    env = {**os.environ, wheelhouse.PAUSE_ENV: "60"}
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(root), str(wheels["1.1.0"]), "1.1.0"], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # both temp files written: the publisher sits in its pause
            temps = list((root / "probe").glob(".kforge-tmp-*"))
            if len(temps) == 2 and all(t.stat().st_size for t in temps):
                break
            assert proc.poll() is None, "the publisher ended before the pause"
            time.sleep(0.05)
        else:
            pytest.fail("the publisher never reached its pause")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (root / "probe" / wheels["1.1.0"].name).exists()
    assert not (root / "probe" / f"{wheels['1.1.0'].name}.manifest.json").exists()
    assert _index_is_consistent(root) == [wheels["1.0.0"].name]
    assert [w.filename for w in wheelhouse.list_wheels(root)] == [wheels["1.0.0"].name]
    # the lock died with the process: the next publisher gets it at once and sweeps the leftovers
    t0 = time.monotonic()
    wheelhouse.publish(root, "probe", wheels["1.1.0"], _manifest("1.1.0"), lock_timeout=10)
    assert time.monotonic() - t0 < 10
    assert not list(root.rglob(".kforge-tmp-*"))
    assert _index_is_consistent(root) == sorted([wheels["1.0.0"].name, wheels["1.1.0"].name])


def test_two_concurrent_publishers(wheels: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "wheelhouse"
    env = {**os.environ, wheelhouse.PAUSE_ENV: "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(root), str(wheels[v]), v], env=env,
                              stdout=subprocess.PIPE, text=True) for v in ("1.1.0", "1.2.0")]
    spans = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        spans.append(tuple(float(x) for x in out.split()))
    assert _index_is_consistent(root) == sorted([wheels["1.1.0"].name, wheels["1.2.0"].name])
    assert not list(root.rglob(".kforge-tmp-*"))
    # the lock serialised them: each held it through its 1 s pause, so together they took >= 2 s
    assert max(e for _, e in spans) - min(s for s, _ in spans) >= 2.0
