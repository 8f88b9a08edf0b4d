"""Variant environments made with the real uv, offline, from a find-links folder of small wheels.

The "torch" here is a fake wheel made by the test (a package named torch with ``__version__``,
``version.cuda`` and ``_C._GLIBCXX_USE_CXX11_ABI``): enough for kforge's provisioning logic and its torch
probe, without downloading torch.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.buildenv import MARKER, provision_env
from kforge.errors import ToolchainError
from kforge.toolchain import detect_torch
from kforge.variant import Variant, provisioning

pytestmark = pytest.mark.integration
HOST_PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def fake_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel holding ``files``, with a valid RECORD."""
    dist = f"{name}-{version}.dist-info"
    contents = dict(files)
    contents[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    contents[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: kforge-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    contents[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in contents.items():
            zf.writestr(path, text)
    return out


def fake_torch(folder: Path, version: str) -> Path:
    return fake_wheel(folder, "torch", version, {
        "torch/__init__.py": f"__version__ = '{version}+cu130'\nfrom . import version, _C\n",
        "torch/version.py": "cuda = '13.0'\n",
        "torch/_C.py": "_GLIBCXX_USE_CXX11_ABI = True\n",
    })


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
