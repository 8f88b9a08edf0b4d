"""Variant environments made with the real uv, offline, from a find-links folder of small wheels.

The "torch" here is a fake wheel made by the test (kforge_testkit.fake_torch (a package named torch with ``__version__``,
``version.cuda`` and ``_C._GLIBCXX_USE_CXX11_ABI``)): enough for kforge's provisioning logic and its torch
probe, without downloading torch.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kforge_testkit import fake_torch, fake_wheel
from packaging.version import Version

from kforge.build.toolchain import detect_torch
from kforge.build.venv import MARKER, provision_env
from kforge.config.variant import Variant, provisioning
from kforge.errors import ToolchainError

pytestmark = pytest.mark.integration
HOST_PY = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture()
def links(tmp_path):
    if not (shutil.which("uv") or (Path(sys.executable).parent / "uv").is_file()):
        pytest.skip("uv is not installed (pip install uv; it is in kforge's test extra)")
    folder = tmp_path / "links"
    fake_torch(folder, "2.9.1")
    fake_wheel(folder, "ninja", "1.11.1", {"ninja/__init__.py": ""})
    return folder


def test_provision_from_find_links_then_reuse(tmp_path, links):
    variant = Variant(cuda=Version("13.0"), python=HOST_PY, torch=Version("2.9.1"))
    prov = provisioning(variant, torch_abi=True, build_isolation=False, host_python=HOST_PY, host_torch=None,
                        cuda_how="installed", cuda_present=True, build_requires=("ninja",))
    assert prov.env_needed and prov.requirements == ("torch==2.9.1", "ninja")
    said: list[str] = []
    env = provision_env(prov, tmp_path / "cache", find_links=str(links), say=said.append)
    assert not env.reused and (env.path / MARKER).is_file()
    assert env.path.parent == tmp_path / "cache" / "envs" and env.path.name.startswith("cu130-torch2.9-cp")
    torch = detect_torch(str(env.python))
    assert torch is not None and torch.version == Version("2.9.1") and torch.cuda == "13.0" and torch.cxx11_abi
    assert any("offline" in line for line in said)
    # pip is there for the native backend's `pip wheel`
    again = provision_env(prov, tmp_path / "cache", find_links=str(links))
    assert again.reused and again.path == env.path


def test_a_torch_the_folder_lacks_is_an_error_and_leaves_nothing(tmp_path, links):
    variant = Variant(cuda=Version("13.0"), python=HOST_PY, torch=Version("2.7.0"))
    prov = provisioning(variant, torch_abi=True, build_isolation=False, host_python=HOST_PY, host_torch=None,
                        cuda_how="installed", cuda_present=True)
    with pytest.raises(ToolchainError) as err:
        provision_env(prov, tmp_path / "cache", find_links=str(links))
    assert "torch==2.7.0" in err.value.what and str(links) in err.value.fix
    assert not any(p.is_dir() for p in (tmp_path / "cache" / "envs").iterdir())


def test_an_interrupted_environment_is_made_again(tmp_path, links):
    variant = Variant(cuda=Version("13.0"), python=HOST_PY, torch=Version("2.9.1"))
    prov = provisioning(variant, torch_abi=True, build_isolation=False, host_python=HOST_PY, host_torch=None,
                        cuda_how="installed", cuda_present=True)
    env = provision_env(prov, tmp_path / "cache", find_links=str(links))
    (env.path / MARKER).unlink()  # as if killed before the marker
    again = provision_env(prov, tmp_path / "cache", find_links=str(links))
    assert not again.reused and (again.path / MARKER).is_file()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def uv_cache_knows_the_registry(tmp_path, links):
    """A uv cache that already holds a registry's index page for torch 2.9.1, as after an online provisioning.

    The registry is a local PEP 503 index served over HTTP, whose torch 2.9.1 wheel (a build tag, other bytes) uv
    has resolved but never downloaded; the server is gone afterwards, so only the cache remembers it.
    """
    registry = tmp_path / "registry"
    files = registry / "files"
    wheel = fake_wheel(files, "torch", "2.9.1", {"torch/__init__.py": "raise ImportError('the registry wheel')\n"})
    tagged = wheel.rename(wheel.with_name("torch-2.9.1-1-py3-none-any.whl"))
    (registry / "simple" / "torch").mkdir(parents=True)
    (registry / "simple" / "torch" / "index.html").write_text(f'<a href="../../files/{tagged.name}">{tagged.name}</a>')
    handler = functools.partial(_QuietHandler, directory=str(registry))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    environ = dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uv-cache"),
                   UV_DEFAULT_INDEX=f"http://127.0.0.1:{server.server_port}/simple")
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    try:
        out = subprocess.run([uv, "pip", "compile", "-", "--no-header", "--python-version", HOST_PY],
                             input="torch==2.9.1\n", env=environ, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 0 and "torch==2.9.1" in out.stdout, out.stderr
    return environ


def test_a_folder_wins_over_a_registry_uvs_cache_knows(tmp_path, links, uv_cache_knows_the_registry):
    """Offline from a folder means the folder only: the cached index page of a registry must not be consulted
    (without --no-index uv picks the registry's wheel and fails offline: "wasn't found in the cache")."""
    variant = Variant(cuda=Version("13.0"), python=HOST_PY, torch=Version("2.9.1"))
    prov = provisioning(variant, torch_abi=True, build_isolation=False, host_python=HOST_PY, host_torch=None,
                        cuda_how="installed", cuda_present=True)
    env = provision_env(prov, tmp_path / "cache", find_links=str(links), environ=uv_cache_knows_the_registry)
    torch = detect_torch(str(env.python))
    assert torch is not None and torch.version == Version("2.9.1")  # the folder's wheel: the registry's one raises
