"""kforge.config.inputs: one rule per kind of input, applied at the edge (CLI arguments and KFORGE_* variables)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.config import inputs
from kforge.config.forge import load_forge
from kforge.errors import ArchError, ConfigError, TargetError, ToolchainError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", ["fmha-sm٩٠", "fmha\u00a0sm90", "ｆmha-sm90", "fmha-sm90\u200b"])
def test_non_ascii_ids_are_refused_with_the_character_named(text: str) -> None:
    with pytest.raises(TargetError, match=r"non-ASCII character at position \d+ \(U\+"):
        inputs.check_id(text)


@pytest.mark.parametrize("text", ["fmha sm90", "-fmha", "fmha/sm90", ""])
def test_ids_are_letters_digits_and_few_signs(text: str) -> None:
    with pytest.raises(TargetError):
        inputs.check_id(text)


def test_good_ids_pass() -> None:
    for text in ("fmha-sm90", "flash-attn-sm120-windows", "flash-attn-sm80+sm120", "fmha"):
        assert inputs.check_id(text) == text


def test_arch_versions_paths() -> None:
    with pytest.raises(ArchError, match="U\\+0669"):
        inputs.check_arch("sm_٩0")
    assert inputs.check_arch("sm_90a") == "sm_90a"
    with pytest.raises(ConfigError, match="not a version"):
        inputs.check_version("2.8 .3", "--sdist-version")
    with pytest.raises(ConfigError, match="non-ASCII"):
        inputs.check_version("２.8", "--sdist-version")
    with pytest.raises(ConfigError, match="U\\+00E9"):
        inputs.check_path("/tmp/wé", "the path --wheelhouse")


def test_cuda_must_be_a_known_release_unless_allowed() -> None:
    assert inputs.check_cuda("12.8") == Version("12.8")
    assert inputs.check_cuda("cu130") == Version("13.0")
    assert inputs.check_cuda("12.8.1") == Version("12.8")


@pytest.mark.parametrize("text", ["12.8.1.2", "12", "12.8a", "v12.8", "12.8.", "cu1280", "12.8.1.2.3"])
def test_a_cuda_version_has_two_or_three_parts(text: str) -> None:
    with pytest.raises(ToolchainError) as err:
        inputs.check_cuda(text, allow_unknown=True)
    assert "is not a CUDA version" in err.value.what and "12.8.1" in err.value.fix
    with pytest.raises(ToolchainError, match=r"CUDA 12\.7 is not a CUDA release kforge knows") as info:
        inputs.check_cuda("12.7")
    assert "12.6, 12.8" in (info.value.why or "") and "--allow-unknown-cuda" in (info.value.fix or "")
    assert inputs.check_cuda("14.1", allow_unknown=True) == Version("14.1")
    with pytest.raises(ToolchainError, match="not a CUDA version"):
        inputs.check_cuda("abc", allow_unknown=True)


def test_check_args_covers_each_kind_and_the_environment() -> None:
    ns = argparse.Namespace
    inputs.check_args(ns(target="fmha-sm90", cuda="13.0", wheelhouse="/tmp/wh"), {})
    with pytest.raises(TargetError):
        inputs.check_args(ns(projects=["fmha", "flash attn"]), {})
    with pytest.raises(ArchError):
        inputs.check_args(ns(arch=["sm_90", "sm_１20"]), {})
    with pytest.raises(ToolchainError, match="KFORGE_CUDA='12.7'"):
        inputs.check_args(ns(target="fmha-sm90", cuda=None), {"KFORGE_CUDA": "12.7"})
    inputs.check_args(ns(target="fmha-sm90", cuda=None), {"KFORGE_CUDA": "12.7", "KFORGE_ALLOW_UNKNOWN_CUDA": "1"})
    inputs.check_args(ns(target="fmha-sm90", cuda="12.7", allow_unknown_cuda=True), {})


@pytest.mark.parametrize(("argv", "code", "needle"), [
    (["plan", "fmha-sm٩٠"], TargetError.exit_code, "U+0669 ARABIC-INDIC DIGIT NINE"),
    (["plan", "fmha-sm90", "--cuda", "12.7"], ToolchainError.exit_code, "Known releases: 11.0"),
    (["patches", "status", "flash-attn", "--arch", "sm_٩0"], ArchError.exit_code, "non-ASCII"),
])
def test_cli_refuses_before_doing_anything(argv: list[str], code: int, needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "kforge", "-C", str(ROOT), *argv], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == code, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_forge_toml_archs_and_project_names_are_ascii_too(tmp_path: Path) -> None:
    good = (ROOT / "forge.toml").read_text(encoding="utf-8")
    (tmp_path / "forge.toml").write_text(good.replace('"sm_80"', '"sm_٨0"', 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="non-ASCII"):
        load_forge(tmp_path)
    (tmp_path / "forge.toml").write_text(good.replace("[projects.fmha]", "[projects.\"fmhá\"]", 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a valid project name"):
        load_forge(tmp_path)
