"""kforge.wheels.merge: per-job wheelhouses merged into one index; conflicts change nothing."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
from kforge_wheelfixtures import make_wheel, manifest, snapshot

from kforge.commands import wheelhouse as cmd
from kforge.errors import PublishError
from kforge.wheels import merge as wheelmerge
from kforge.wheels import wheelhouse


def _job(tmp: Path, name: str, *wheels: tuple[str, str, str]) -> Path:
    """A per-job wheelhouse: (project, dist name, version) each, published the normal way."""
    root = tmp / name
    for project, dist, version in wheels:
        wheel = make_wheel(tmp / f"dist-{name}-{dist}-{version}", name=dist, version=version)
        report = tmp / f"report-{name}-{dist}" / "report.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text('{"job": "%s"}' % name)
        wheelhouse.publish(root, project, wheel, manifest(f"{project}-sm90", project), attachments=(report,))
    return root


def test_two_job_wheelhouses_merge_into_one_index(tmp_path: Path) -> None:
    a = _job(tmp_path, "job-sm80", ("fmha", "kforge_fmha", "0.1.0+sm80"))
    b = _job(tmp_path, "job-sm90", ("fmha", "kforge_fmha", "0.1.0+sm90"), ("flash-attn", "flash_attn", "2.8.3"))
    dest = tmp_path / "site"
    result = wheelmerge.merge(dest, [a, b])
    assert sorted(result.added) == ["flash-attn/flash_attn-2.8.3-py3-none-any.whl",
                                    "fmha/kforge_fmha-0.1.0+sm80-py3-none-any.whl",
                                    "fmha/kforge_fmha-0.1.0+sm90-py3-none-any.whl"]
    assert wheelhouse.verify(dest).problems == ()
    page = (dest / "simple" / "kforge-fmha" / "index.html").read_text()
    for src in (a, b):
        for w in wheelhouse.list_wheels(src, "fmha"):
            assert f"{w.filename}#sha256={hashlib.sha256(w.wheel.read_bytes()).hexdigest()}" in page
            merged = dest / "fmha" / w.filename
            assert merged.read_bytes() == w.wheel.read_bytes()
            assert (dest / "fmha" / f"{w.filename}.report" / "report.json").is_file()
    # merging again changes nothing and says so
    again = wheelmerge.merge(dest, [a, b])
    assert again.added == () and len(again.unchanged) == 3


def test_a_conflicting_sha256_between_sources_merges_nothing(tmp_path: Path) -> None:
    a = _job(tmp_path, "job-a", ("fmha", "kforge_fmha", "0.1.0"), ("fmha", "kforge_fmha", "0.2.0"))
    b = tmp_path / "job-b"
    wheelhouse.publish(b, "fmha", make_wheel(tmp_path / "other", name="kforge_fmha", version="0.1.0", body="Y = 2\n"),
                       manifest("fmha-sm90", "fmha"))
    dest = tmp_path / "site"
    with pytest.raises(PublishError, match="comes from two wheelhouses with different contents; nothing was merged"):
        wheelmerge.merge(dest, [a, b])
    assert not (dest / "fmha").exists()  # not even the non-conflicting 0.2.0


def test_a_conflict_with_the_destination_changes_nothing_unless_replace(tmp_path: Path) -> None:
    dest = _job(tmp_path, "site", ("fmha", "kforge_fmha", "0.1.0"))
    before = snapshot(dest)
    b = tmp_path / "job-b"
    new = make_wheel(tmp_path / "other", name="kforge_fmha", version="0.1.0", body="Y = 2\n")
    wheelhouse.publish(b, "fmha", new, manifest("fmha-sm90", "fmha"))
    wheelhouse.publish(b, "fmha", make_wheel(tmp_path / "n2", name="kforge_fmha", version="0.3.0"),
                       manifest("fmha-sm90", "fmha"))
    with pytest.raises(PublishError, match="already in .* with different contents; nothing was merged") as info:
        wheelmerge.merge(dest, [b])
    assert "--replace" in (info.value.fix or "")
    assert snapshot(dest) == before
    result = wheelmerge.merge(dest, [b], replace=True)
    assert result.replaced == ("fmha/kforge_fmha-0.1.0-py3-none-any.whl",)
    assert (dest / "fmha" / new.name).read_bytes() == new.read_bytes()
    assert wheelhouse.verify(dest).problems == ()


def test_a_source_that_does_not_verify_is_refused(tmp_path: Path) -> None:
    a = _job(tmp_path, "job-a", ("fmha", "kforge_fmha", "0.1.0"))
    (w,) = wheelhouse.list_wheels(a)
    w.wheel.write_bytes(w.wheel.read_bytes()[:-1] + b"!")
    with pytest.raises(PublishError, match="does not verify"):
        wheelmerge.merge(tmp_path / "site", [a])
    with pytest.raises(PublishError, match="not a wheelhouse folder"):
        wheelmerge.merge(tmp_path / "site", [tmp_path / "nope"])


def test_cli_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _job(tmp_path, "job-a", ("fmha", "kforge_fmha", "0.1.0"))
    b = _job(tmp_path, "job-b", ("fmha", "kforge_fmha", "0.2.0"))
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["wheelhouse", "--wheelhouse", str(tmp_path / "site"), "merge", str(a), str(b)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "added     fmha/kforge_fmha-0.1.0-py3-none-any.whl" in out and "merged 2 wheelhouse(s)" in out
