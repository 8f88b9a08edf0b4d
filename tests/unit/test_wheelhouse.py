"""kforge.wheels.wheelhouse: publish, manifest, PEP 503 index, list, clean, CLI (pip and kill tests are in integration)."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import stat
import zipfile
from pathlib import Path

import pytest

from kforge.commands import wheelhouse as cmd
from kforge.errors import PublishError
from kforge.wheels import wheelhouse
from kforge.wheels.wheelhouse import Manifest


def make_wheel(folder: Path, name: str = "kforge_tiny", version: str = "0.1.0", body: str = "X = 1\n",
               tag: str = "py3-none-any") -> Path:
    """A small valid wheel written by hand (METADATA, WHEEL, RECORD)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": body,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n",
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: kforge-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            data = text.encode()
            zf.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


def manifest(target: str = "tiny-sm90") -> Manifest:
    return Manifest(target=target, project="tiny", archs=("sm_90",), source_kind="local", source_pin="abc123",
                    patch_series_hash="ff00", toolchain={"nvcc": "13.0.88", "torch": None, "python": "3.11.7"},
                    host={"machine": "ci", "cpus": 2}, built_at="2026-11-21T06:00:00+00:00", build_seconds=12.5,
                    peak_rss=123456789, doctor={"ok": True, "binaries": []})


def _hrefs(page: str) -> list[str]:
    return re.findall(r'href="([^"]+)"', page)


def test_publish_stores_wheel_manifest_and_index(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist")
    report = tmp_path / "r" / "report.json"
    report.parent.mkdir()
    report.write_text("{}")
    (tmp_path / "r" / "timeline.html").write_text("<html></html>")
    root = tmp_path / "wh"
    pub = wheelhouse.publish(root, "tiny", wheel, manifest(), attachments=(report, tmp_path / "r" / "timeline.html"))
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert pub.wheel == root / "tiny" / wheel.name and pub.wheel.read_bytes() == wheel.read_bytes()
    assert pub.manifest == root / "tiny" / f"{wheel.name}.manifest.json"
    assert pub.index == root / "simple" / "index.html"
    data = json.loads(pub.manifest.read_text())
    assert data["sha256"] == sha and data["size"] == wheel.stat().st_size and data["wheel"] == wheel.name
    for key in ("target", "source_pin", "patch_series_hash", "toolchain", "host", "built_at", "build_seconds",
                "peak_rss", "doctor", "report_path"):
        assert key in data
    assert data["toolchain"]["nvcc"] == "13.0.88"
    assert data["report_path"] == f"{wheel.name}.report/report.json"
    assert (root / "tiny" / data["report_path"]).read_text() == "{}"
    assert (root / "tiny" / f"{wheel.name}.report" / "timeline.html").is_file()
    assert Manifest.from_json(pub.manifest.read_text()) == pub.record
    # PEP 503 pages
    assert _hrefs((root / "simple" / "index.html").read_text()) == ["kforge-tiny/"]
    page = (root / "simple" / "kforge-tiny" / "index.html").read_text()
    assert _hrefs(page) == [f"../../tiny/{wheel.name}#sha256={sha}"]
    assert page.startswith("<!DOCTYPE html>")
    assert not list(root.rglob(".kforge-tmp-*"))


def test_same_wheel_again_is_idempotent_but_different_bytes_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    wheel = make_wheel(tmp_path / "a")
    wheelhouse.publish(root, "tiny", wheel, manifest())
    wheelhouse.publish(root, "tiny", wheel, manifest())
    other = make_wheel(tmp_path / "b", body="X = 2\n")  # same file name, other content
    with pytest.raises(PublishError, match="different sha256"):
        wheelhouse.publish(root, "tiny", other, manifest())
    assert (root / "tiny" / wheel.name).read_bytes() == wheel.read_bytes()  # untouched
    pub = wheelhouse.publish(root, "tiny", other, manifest(), replace=True)
    assert pub.sha256 == hashlib.sha256(other.read_bytes()).hexdigest()
    assert pub.sha256 in (root / "simple" / "kforge-tiny" / "index.html").read_text()


def test_bad_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "notawheel.zip"
    bad.write_text("x")
    with pytest.raises(PublishError, match="not a wheel file name"):
        wheelhouse.publish(tmp_path / "wh", "tiny", bad, manifest())
    with pytest.raises(PublishError, match="does not exist"):
        wheelhouse.publish(tmp_path / "wh", "tiny", tmp_path / "kforge_tiny-0.1-py3-none-any.whl", manifest())
    for name in ("simple", "../x", ".hidden", ""):
        with pytest.raises(PublishError):
            wheelhouse.publish(tmp_path / "wh", name, make_wheel(tmp_path / "d"), manifest())


def test_index_lists_only_complete_wheels(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    good = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    # a wheel without a manifest (a crash between the renames) and one truncated after its manifest
    orphan = make_wheel(root / "tiny", version="0.2.0")
    trunc_src = make_wheel(tmp_path / "c", version="0.3.0")
    wheelhouse.publish(root, "tiny", trunc_src, manifest())
    trunc = root / "tiny" / trunc_src.name
    trunc.write_bytes(trunc.read_bytes()[:50])
    (root / "tiny" / ".kforge-tmp-stale.whl.123").write_bytes(b"half")
    wheelhouse.rebuild_index(root)
    assert [w.filename for w in wheelhouse.list_wheels(root)] == [good.filename]
    page = (root / "simple" / "kforge-tiny" / "index.html").read_text()
    assert good.filename in page and orphan.name not in page and trunc.name not in page
    assert not list(root.rglob(".kforge-tmp-*"))


def test_several_projects_and_distributions(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    wheelhouse.publish(root, "flash-attn", make_wheel(tmp_path / "a", name="flash_attn", version="2.8.3+cu130torch2.11",
                                                      tag="cp311-cp311-linux_x86_64"), manifest("flash-attn-sm90"))
    wheelhouse.publish(root, "fmha", make_wheel(tmp_path / "b", name="fmha"), manifest("fmha-sm90"))
    assert _hrefs((root / "simple" / "index.html").read_text()) == ["flash-attn/", "fmha/"]
    fa = (root / "simple" / "flash-attn" / "index.html").read_text()
    assert "../../flash-attn/flash_attn-2.8.3+cu130torch2.11-cp311-cp311-linux_x86_64.whl#sha256=" in fa
    assert [w.project for w in wheelhouse.list_wheels(root)] == ["flash-attn", "fmha"]
    assert [w.project for w in wheelhouse.list_wheels(root, "fmha")] == ["fmha"]
    assert wheelhouse.clean(root, "fmha") == 1
    assert not (root / "simple" / "fmha").exists()
    assert _hrefs((root / "simple" / "index.html").read_text()) == ["flash-attn/"]
    assert wheelhouse.clean(root) == 1
    assert _hrefs((root / "simple" / "index.html").read_text()) == []


def test_cli_index_list_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "wh"
    wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cmd.register(sub)

    def run(*argv: str) -> int:
        args = parser.parse_args(["wheelhouse", "--wheelhouse", str(root), *argv])
        return args.func(args)

    assert run("index") == 0
    assert "1 wheels" in capsys.readouterr().out
    assert run("list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["target"] == "tiny-sm90" and len(listed[0]["sha256"]) == 64
    assert run("list") == 0
    assert "kforge_tiny-0.1.0-py3-none-any.whl" in capsys.readouterr().out
    assert run("clean", "tiny") == 0
    assert "removed 1 wheel" in capsys.readouterr().out
    assert run("list") == 0
    assert "no wheels" in capsys.readouterr().out


def test_cli_root_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_WHEELHOUSE", str(tmp_path / "env-wh"))
    assert cmd.wheelhouse_root(argparse.Namespace(wheelhouse=None, root=None)) == (tmp_path / "env-wh").resolve()
    monkeypatch.delenv("KFORGE_WHEELHOUSE")
    assert cmd.wheelhouse_root(argparse.Namespace(wheelhouse=None, root=str(tmp_path))) == tmp_path.resolve() / "wheelhouse"


# --------------------------------------------------------------------------- verifies, never trusts


def test_a_manifest_whose_sha256_disagrees_is_left_out_and_named(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    good = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    other = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "b", version="0.2.0"), manifest())
    data = json.loads(other.manifest.read_text())
    data["sha256"] = "0" * 64
    other.manifest.write_text(json.dumps(data))
    result = wheelhouse.rebuild_index(root)
    assert [w.filename for w in result.wheels] == [good.filename]
    (problem,) = result.problems
    assert problem.path == other.manifest and "records sha256 000000000000" in problem.what
    assert "kforge build" in problem.fix and "--replace" in problem.fix
    page = (root / "simple" / "kforge-tiny" / "index.html").read_text()
    assert good.filename in page and other.filename not in page


@pytest.mark.parametrize("text", ["{not json", "[]", '{"sha256": 5}', "\xff\xfe{".encode("latin-1").decode("latin-1")])
def test_a_corrupt_manifest_is_an_error_naming_the_file_and_the_fix(tmp_path: Path, text: str) -> None:
    root = tmp_path / "wh"
    pub = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    pub.manifest.write_bytes(text.encode("latin-1"))
    with pytest.raises(PublishError, match=re.escape(str(pub.manifest)) + " is corrupt") as info:
        wheelhouse.read_manifest(pub.manifest)
    assert "kforge wheelhouse clean" in (info.value.fix or "")
    (problem,) = wheelhouse.scan(root).problems
    assert problem.path == pub.manifest


def test_a_corrupted_wheel_is_refused_by_the_index_and_by_verify(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    pub = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    assert wheelhouse.verify(root).problems == ()
    data = bytearray(pub.wheel.read_bytes())
    data[10] ^= 0xFF  # same size, other bytes
    pub.wheel.write_bytes(bytes(data))
    problems = wheelhouse.verify(root).problems
    assert any(p.path == pub.manifest and "hashes to" in p.what for p in problems)
    assert any("does not list exactly the verified wheels" in p.what for p in problems)


def test_same_file_name_from_two_projects_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    with pytest.raises(PublishError, match="already published by the project tiny"):
        wheelhouse.publish(root, "other", make_wheel(tmp_path / "b", body="X = 3\n"), manifest())
    assert not (root / "other" / "kforge_tiny-0.1.0-py3-none-any.whl").exists()


def test_published_files_are_world_readable_whatever_the_umask(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text("{}")
    old = os.umask(0o077)
    try:
        wheelhouse.publish(tmp_path / "wh", "tiny", make_wheel(tmp_path / "a"), manifest(), attachments=(report,))
    finally:
        os.umask(old)
    root = tmp_path / "wh"
    for path in [root, *root.rglob("*")]:
        if path.name.startswith(".kforge.lock"):
            continue
        want = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == want, path
    assert wheelhouse.verify(root).problems == ()
    os.chmod(root / "tiny", 0o700)  # an older kforge's modes: verify names them, index fixes them
    assert any("not world-readable" in p.what for p in wheelhouse.verify(root).problems)
    wheelhouse.rebuild_index(root)
    assert wheelhouse.verify(root).problems == ()


def test_verify_names_orphans_stale_temps_and_stale_pages(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    pub = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    make_wheel(root / "tiny", version="0.9.0")  # a wheel without a manifest
    (root / "tiny" / "gone-1.0-py3-none-any.whl.manifest.json").write_text(pub.manifest.read_text())
    (root / "tiny" / ".kforge-tmp-x.whl.1").write_bytes(b"half")
    (root / "simple" / "old-dist").mkdir()
    (root / "simple" / "old-dist" / "index.html").write_text("<html></html>")
    whats = sorted(p.what for p in wheelhouse.verify(root).problems)
    assert any("without a manifest" in w for w in whats)
    assert any("manifest without its wheel" in w for w in whats)
    assert any("temporary file" in w for w in whats)
    assert any("no verified wheel" in w for w in whats)


def test_cli_verify_exits_11_on_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "wh"
    pub = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "a"), manifest())
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["wheelhouse", "--wheelhouse", str(root), "verify"])
    assert args.func(args) == 0
    assert "1 wheel(s), manifests, index and modes verified" in capsys.readouterr().out
    pub.manifest.write_text("{")
    with pytest.raises(PublishError) as info:
        args.func(args)
    assert info.value.exit_code == 11
    assert str(pub.manifest) in capsys.readouterr().err
