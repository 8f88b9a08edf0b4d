"""kforge.preflight: the checks a build runs before any compile (real folders; full and read-only disks are
in tests/faults/)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import pytest

from kforge import preflight
from kforge.build.host import detect_host
from kforge.commands._common import plan_from_args
from kforge.errors import BuildError, PublishError, ToolchainError
from kforge.wheels import wheelhouse


def test_expected_wheel_size_comes_from_earlier_manifests(tmp_path: Path) -> None:
    assert preflight.expected_wheel_bytes(tmp_path, "fmha") == (preflight.DEFAULT_WHEEL_BYTES, "estimate")
    folder = tmp_path / "fmha"
    folder.mkdir()
    for name, size in (("a-1-py3-none-any.whl", 5_000_000), ("b-1-py3-none-any.whl", 7_000_000)):
        (folder / f"{name}.manifest.json").write_text(json.dumps({"target": "fmha-sm90", "size": size}))
    (folder / "c-1-py3-none-any.whl.manifest.json").write_text("{not json")  # skipped, not fatal
    assert preflight.expected_wheel_bytes(tmp_path, "fmha") == (7_000_000, "earlier builds")


def test_wheelhouse_and_work_probes_leave_nothing_behind(tmp_path: Path) -> None:
    preflight.check_wheelhouse(tmp_path / "wh", "fmha-sm90")
    preflight.check_work(tmp_path / "root" / ".kforge" / "work" / "fmha-sm90")
    assert sorted(p.name for p in (tmp_path / "wh").iterdir()) == [wheelhouse.LOCK_NAME]
    assert list((tmp_path / "root" / ".kforge" / "work").iterdir()) == []


def test_a_wheelhouse_that_is_a_file_is_a_publish_error(tmp_path: Path) -> None:
    (tmp_path / "wh").write_text("")
    with pytest.raises(PublishError, match="is a file"):
        preflight.check_wheelhouse(tmp_path / "wh", "fmha-sm90")


def test_work_under_a_file_is_a_build_error(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("")
    with pytest.raises(BuildError, match="cannot be written"):
        preflight.check_work(tmp_path / "root" / ".kforge" / "work" / "x")


def test_space_is_checked_against_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_wh, need_work, free_wh, _ = preflight.check_space(tmp_path / "wh", tmp_path / "w" / "t", 1 << 20, "estimate")
    assert need_wh < need_work <= free_wh
    with pytest.raises((BuildError, PublishError), match="not enough free space"):
        preflight.check_space(tmp_path / "wh", tmp_path / "w" / "t", 1 << 60, "earlier builds")


def test_full_tmp_is_a_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(BuildError, match="temp folder .* cannot be written"):
        preflight.check_tmp({"TMPDIR": str(tmp_path / "file")})
    assert preflight.check_tmp({"TMPDIR": str(tmp_path)}) == tmp_path


def test_toolchain_of_the_plan(tmp_path: Path) -> None:
    """A plan asking for CUDA 12.8 (not provisionable) on a host without it fails in preflight."""
    root = Path(__file__).resolve().parents[2]
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    host = detect_host(environ)
    args = argparse.Namespace(root=str(root), cuda="12.8", env=[])
    plan = plan_from_args(args, "fmha-sm90", environ=environ, host=host)
    with pytest.raises(ToolchainError, match="checked before compiling"):
        preflight.check_toolchain(plan, host, {**environ, "CUDA_HOME": str(tmp_path / "none")})
    args.cuda = "13.0"
    plan13 = plan_from_args(args, "fmha-sm90", environ=environ, host=host)
    where = preflight.check_toolchain(plan13, host, {**environ, "CUDA_HOME": str(tmp_path / "none")})
    assert os.path.basename(where) == "nvcc" or where.startswith("provision")


def test_the_cmake_backend_needs_cmake_on_path(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    environ = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no cmake there
    host = detect_host(environ)
    plan = plan_from_args(argparse.Namespace(root=str(root), cuda="13.0", backend="cmake", env=[]), "fmha-sm90",
                          environ=environ, host=host)
    with pytest.raises(ToolchainError, match="cmake is not on the build's PATH"):
        preflight.check_toolchain(plan, host, {**environ, "CUDA_HOME": "/usr/local/cuda-13.0"})


def test_a_torch_build_whose_variant_environment_brings_torch_passes_without_host_torch(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CUDA_HOME": "/usr/local/cuda-13.0"}
    host = detect_host(environ).with_(torch_version=None)
    ns = argparse.Namespace(root=str(root), cuda="13.0", env=[])
    plain = plan_from_args(ns, "flash-attn-sm90", environ=environ, host=host)
    # plan_from_args asks this interpreter for torch: where it has one (CI's nox venv has a CPU torch), the
    # build uses it; where it has none, the variant's environment brings torch.
    has_torch = importlib.util.find_spec("torch") is not None
    assert plain.provisioning is not None and plain.provisioning.env_needed is not has_torch
    ns.torch = "2.9.1"
    plan = plan_from_args(ns, "flash-attn-sm90", environ=environ, host=host)
    assert plan.provisioning is not None and "uv pip install torch==2.9.1" in plan.provisioning.part("torch").how
    preflight.check_toolchain(plan, host, environ)  # no error: the environment step provisions torch
