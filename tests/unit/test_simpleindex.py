"""The static index pages: PEP 691 JSON read back with json/packaging, hashes checked, per-CUDA folders."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from kforge.wheels import simpleindex, wheelhouse
from kforge.wheels.wheelhouse import Manifest


def _wheel(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"demo_kernel-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo_kernel/__init__.py", version)
    return path


def test_json_pages_list_every_wheel_with_its_sha256(tmp_path):
    root = tmp_path / "wh"
    wheelhouse.publish(root, "demo", _wheel(tmp_path / "a", "1.0+cu130"), Manifest(target="demo-sm90", variant="cu130-cp312"))
    wheelhouse.publish(root, "demo", _wheel(tmp_path / "b", "1.0+cu128"), Manifest(target="demo-sm90",
                                                                                   toolchain={"cuda": "12.8"}))
    top = json.loads((root / "simple" / simpleindex.JSON_PAGE).read_text())
    assert top == {"meta": {"api-version": "1.0"}, "projects": [{"name": "demo-kernel"}]}
    page = json.loads((root / "simple" / "demo-kernel" / simpleindex.JSON_PAGE).read_text())
    assert page["name"] == "demo-kernel" and len(page["files"]) == 2
    for f in page["files"]:
        name, version, _, _ = parse_wheel_filename(f["filename"])
        assert canonicalize_name(name) == "demo-kernel"
        wheel = (root / "simple" / "demo-kernel" / f["url"]).resolve()
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == f["hashes"]["sha256"]
    # per CUDA: each index holds its own wheel only (the second one's CUDA came from its manifest's toolchain)
    for tag, label in (("cu130", "cu130"), ("cu128", "cu128")):
        sub = json.loads((root / tag / "simple" / "demo-kernel" / simpleindex.JSON_PAGE).read_text())
        assert [f["filename"] for f in sub["files"]] == [f"demo_kernel-1.0+{label}-py3-none-any.whl"]
        url = (root / tag / "simple" / "demo-kernel" / sub["files"][0]["url"]).resolve()
        assert url.is_file()
        assert f"1.0+{label}" in (root / tag / "simple" / "demo-kernel" / "index.html").read_text()
    # the per-CUDA folders are not mistaken for projects
    assert {w.project for w in wheelhouse.list_wheels(root)} == {"demo"}


def test_a_cuda_index_without_wheels_goes_away(tmp_path):
    root = tmp_path / "wh"
    wheelhouse.publish(root, "demo", _wheel(tmp_path / "a", "1.0+cu130"), Manifest(target="demo-sm90", variant="cu130-cp312"))
    assert (root / "cu130" / "simple").is_dir()
    wheelhouse.clean(root, "demo")
    assert not (root / "cu130").exists()
    assert json.loads((root / "simple" / simpleindex.JSON_PAGE).read_text())["projects"] == []


def test_cuda_tag_from_variant_or_toolchain():
    assert simpleindex.cuda_tag("cu129-torch2.9-cp310", None) == "cu129"
    assert simpleindex.cuda_tag(None, "13.0") == "cu130"
    assert simpleindex.cuda_tag(None, None) is None
    assert simpleindex.is_variant_folder("cu130") and not simpleindex.is_variant_folder("cutlass")


def test_verify_checks_the_json_and_per_cuda_pages_too(tmp_path):
    root = tmp_path / "wh"
    wheelhouse.publish(root, "demo", _wheel(tmp_path / "a", "1.0+cu130"), Manifest(target="demo-sm90", variant="cu130-cp312"))
    (root / "releases").mkdir()
    (root / "releases" / "demo.json").write_text("{}\n")
    (root / "releases" / "demo.json").chmod(0o644)
    assert wheelhouse.verify(root).problems == ()  # the release manifests' folder is not a project
    page = root / "cu130" / "simple" / "demo-kernel" / simpleindex.JSON_PAGE
    page.write_text(page.read_text().replace('"sha256": "', '"sha256": "0'))
    problems = wheelhouse.verify(root).problems
    assert [p.path for p in problems] == [page]
