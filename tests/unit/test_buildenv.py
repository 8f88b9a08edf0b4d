"""Variant environments without running uv: the commands, the cache key, the errors (a fake runner)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.build.venv import MARKER, env_key, find_uv, provision_env, python_request
from kforge.config.variant import Variant, provisioning
from kforge.errors import ToolchainError

V = Variant(cuda=Version("13.0"), python="3.10", torch=Version("2.9.1"))


def _prov(variant=V):  # noqa: ANN001, ANN202
    return provisioning(variant, torch_abi=True, build_isolation=False, host_python="3.12", host_torch=None,
                        cuda_how="installed", cuda_present=True, build_requires=("ninja",))


class FakeUv:
    def __init__(self, fail_at: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail_at = fail_at

    def __call__(self, argv, *, env=None, timeout=0):  # noqa: ANN001, ANN204
        self.calls.append(list(argv))
        step = "venv" if argv[1] == "venv" else ("ensurepip" if "ensurepip" in argv else "install")
        if step == "venv":
            (Path(argv[-1]) / "bin").mkdir(parents=True)
            (Path(argv[-1]) / "bin" / "python").write_text("")
        code = 1 if step == self.fail_at else 0
        return subprocess.CompletedProcess(argv, code, "", f"{step} failed" if code else "")


def test_offline_commands_and_reuse(tmp_path):
    uv = FakeUv()
    env = provision_env(_prov(), tmp_path, find_links=str(tmp_path / "links"), runner=uv, uv="uv")
    venv, ensurepip, install = uv.calls
    assert venv[:3] == ["uv", "venv", "--quiet"] and "--offline" in venv and venv[venv.index("--python") + 1] == "3.10"
    assert ensurepip[1:] == ["-m", "ensurepip", "--default-pip"]
    assert "--offline" in install and install[install.index("--find-links") + 1] == str(tmp_path / "links")
    assert "--no-index" in install  # the folder only: never a registry page that uv's cache remembers
    assert install[-2:] == ["torch==2.9.1", "ninja"]
    assert (env.path / MARKER).is_file() and not env.reused
    again = provision_env(_prov(), tmp_path, find_links=str(tmp_path / "links"), runner=FakeUv(), uv="uv")
    assert again.reused and again.path == env.path


def test_index_url_is_passed_and_is_part_of_the_key(tmp_path):
    uv = FakeUv()
    provision_env(_prov(), tmp_path, index_url="https://download.pytorch.org/whl/{cuda}", runner=uv, uv="uv")
    assert uv.calls[-1][uv.calls[-1].index("--index-url") + 1] == "https://download.pytorch.org/whl/cu130"
    assert "--offline" not in uv.calls[-1]
    assert env_key(V, ("torch==2.9.1",), None, None) != env_key(V, ("torch==2.9.1",), "https://x", None)


@pytest.mark.parametrize("step,needle", [("venv", "install Python 3.10"), ("install", "put those wheels"),
                                         ("ensurepip", "python3.10-venv")])
def test_a_failed_step_says_what_to_install_and_leaves_no_environment(tmp_path, step, needle):
    with pytest.raises(ToolchainError) as err:
        provision_env(_prov(), tmp_path, find_links=str(tmp_path / "links"), runner=FakeUv(fail_at=step), uv="uv")
    assert needle in (err.value.fix or "") and f"{step} failed" in (err.value.why or "")
    assert [p for p in (tmp_path / "envs").iterdir() if p.is_dir()] == []


def test_no_uv_is_an_error_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    with pytest.raises(ToolchainError) as err:
        find_uv({"PATH": str(tmp_path)}, which=lambda name, path=None: None)
    assert "pip install uv" in (err.value.fix or "")


def test_the_running_python_is_asked_for_by_path():
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert python_request(here) == sys.executable
    assert python_request("3.9" if here != "3.9" else "3.8") in ("3.9", "3.8")
