"""The standalone doctor judges a published wheel the way its build did (kforge.doctor.judgement).

A torch extension links libcudart.so.13 shared (torch brings it); kforge's torch policy excludes it from
repair. Without the manifest the doctor can't know that and asks "was the wheel repaired?"; with the
manifest next to the wheel (as the wheelhouse has it), or with --project, it judges by the same policy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kforge.cli import main
from kforge.doctor.judgement import Judgement
from kforge.wheels.repair import default_policy

pytestmark = pytest.mark.integration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_doctor_builders as B  # noqa: E402
from kforge_testkit import write_forge_toml  # noqa: E402

PROJECT = """\
[projects.ext]
source = {{ local = "ext" }}
archs = ["sm_80", "sm_90"]
platforms = ["linux-x86_64"]
torch_abi = {torch}
"""


@pytest.fixture()
def torch_wheel(nvcc: str, work: Path, tmp_path: Path) -> Path:
    ext = B.linux_extension(nvcc, work / "judgement")
    return B.make_wheel(tmp_path / "wh", "ext-pkg", "0.1.0", "cp311-cp311-linux_x86_64", {
        "ext_pkg/__init__.py": b"", "ext_pkg/_ext.so": ext.ext,
        "ext_pkg/libkfhelper.so": ext.helper_dir / "libkfhelper.so",  # as if repair had grafted the helper
    })


def doctor(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    code = main(["doctor", *argv, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def _codes(report: dict) -> list[tuple[str, str]]:
    return [(f["code"], f["message"]) for f in report["findings"]]


def test_manifest_policy_and_archs_judge_the_wheel(torch_wheel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = doctor([str(torch_wheel), "--policy", "torch-free"], capsys)
    assert any(c == "unbundled-needed" and "libcudart.so.13" in m for c, m in _codes(report))  # the old complaint

    judged = Judgement(policy=default_policy("ext", torch=True, cudart_shared=True), expect=("sm_80",), exact=True)
    manifest = Path(str(torch_wheel) + ".manifest.json")
    manifest.write_text(json.dumps({"project": "ext", "doctor": {"judged_by": judged.to_dict()}}))
    code, report, _ = doctor([str(torch_wheel)], capsys)
    assert code == 0 and report["ok"] and not any("libcudart" in m for _, m in _codes(report)), report["findings"]
    # the manifest's exact archs are held to: asking for sm_90 on the command line overrides them and fails
    code, report, _ = doctor([str(torch_wheel), "--expect-arch", "sm_90"], capsys)
    assert code == 9 and [c for c, _ in _codes(report) if c in ("missing-arch", "extra-arch")] == ["missing-arch", "extra-arch"]

    # an older manifest (no judged_by): torch from its toolchain record
    manifest.write_text(json.dumps({"project": "ext", "archs": ["sm_80"], "toolchain": {"torch": "2.11.0"}}))
    code, report, _ = doctor([str(torch_wheel)], capsys)
    assert code == 0 and not any("libcudart" in m for _, m in _codes(report))


@pytest.mark.parametrize("torch, complains", [(True, False), (False, True)])
def test_project_policy_from_forge_toml(torch_wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        torch: bool, complains: bool) -> None:
    write_forge_toml(tmp_path / "mono", PROJECT.format(torch=str(torch).lower()))
    rc = main(["-C", str(tmp_path / "mono"), "doctor", str(torch_wheel), "--project", "ext", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert any("libcudart.so.13" in m for _, m in _codes(report)) == complains
