"""The series format, its conditions, the patch-file reader and hunk analysis (no git needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.config.forge import load_forge
from kforge.cuda.arch import parse_arch
from kforge.errors import PatchError
from kforge.sources.patches import analyse
from kforge.sources.series import Condition, PatchContext, load_series, parse_patch, series_hash

REPO = Path(__file__).resolve().parents[2]

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: kforge <kforge@users.noreply.invalid>
Subject: [PATCH] setup: tweak

---
 a.txt | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/a.txt b/a.txt
index 1111111..2222222 100644
--- a/a.txt
+++ b/a.txt
@@ -2,3 +2,3 @@ header
 two
-three
+THREE
 four
@@ -8,2 +8,3 @@ header
 eight
 nine
+nine and a half
diff --git a/new.txt b/new.txt
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+hello
-- 
2.39.5
"""


def write_series(d: Path, text: str, names: tuple[str, ...] = ("a.patch", "b.patch", "c.patch")) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_text(PATCH)
    (d / "series").write_text(text)
    return d


def test_series_entries_conditions_and_selection(tmp_path: Path) -> None:
    d = write_series(tmp_path / "p", "# header\n\na.patch\nb.patch  platform=windows   # MSVC only\nc.patch arch>=sm_120 upstream<2.9\n")
    s = load_series(d)
    assert [e.name for e in s.entries] == ["a.patch", "b.patch", "c.patch"]
    assert s.header == ("# header",)
    assert s.entries[1].condition_text == "platform=windows"
    linux90 = PatchContext("linux-x86_64", ("sm_90a",), "2.8.3")
    win120 = PatchContext("windows-amd64", ("sm_90a", "sm_120a"), "2.8.3")
    new_upstream = PatchContext("windows-amd64", ("sm_120a",), "2.9.0")
    assert [e.name for e in s.select(linux90)] == ["a.patch"]
    assert [e.name for e in s.select(win120)] == ["a.patch", "b.patch", "c.patch"]
    assert [e.name for e in s.select(new_upstream)] == ["a.patch", "b.patch"]


@pytest.mark.parametrize(
    ("cond", "ctx", "expected"),
    [
        (Condition("platform", "=", "windows"), PatchContext("windows-amd64"), True),
        (Condition("platform", "=", "linux"), PatchContext("linux-aarch64"), True),
        (Condition("platform", "=", "linux-x86_64"), PatchContext("linux-aarch64"), False),
        (Condition("platform", "!=", "windows"), PatchContext("linux-x86_64"), True),
        (Condition("platform", "=", "linux,windows"), PatchContext("windows"), True),
        (Condition("arch", "=", "sm_120"), PatchContext("linux", ("sm_120a",)), True),
        (Condition("arch", "=", "sm_120a"), PatchContext("linux", ("sm_120f",)), False),
        (Condition("arch", "=", "12.0f"), PatchContext("linux", ("sm_120f",)), True),
        (Condition("arch", "!=", "sm_90a"), PatchContext("linux", ("sm_90a", "sm_120a")), False),
        (Condition("arch", ">=", "sm_100"), PatchContext("linux", ("sm_90a",)), False),
        (Condition("arch", ">=", "sm_100"), PatchContext("linux", ("sm_80", "sm_103a")), True),
        (Condition("arch", "<", "sm_90"), PatchContext("linux", ("sm_80",)), True),
        (Condition("upstream", ">=", "2.8.3"), PatchContext("linux", (), "2.8.3.post2"), True),
        (Condition("upstream", "=", "2.8.*"), PatchContext("linux", (), "2.9.0"), False),
        (Condition("upstream", "<", "2.9,>=2.8"), PatchContext("linux", (), "2.8.3"), True),
    ],
)
def test_condition_semantics(cond: Condition, ctx: PatchContext, expected: bool) -> None:
    assert cond.holds(ctx) is expected


def test_upstream_condition_without_a_version_is_an_error() -> None:
    with pytest.raises(PatchError, match="upstream version"):
        Condition("upstream", ">=", "2.8").holds(PatchContext("linux", (), None))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("a.patch platfrom=windows", "did you mean 'platform'"),
        ("a.patch platform>=windows", "platform takes only"),
        ("a.patch arch>=sm_90,sm_100", "compares with a list"),
        ("a.patch arch=banana", "not an arch"),
        ("a.patch upstream>=not-a-version!", "not a version condition"),
        ("a.patch windows", "cannot read condition"),
        ("missing.patch", "does not exist"),
        ("a.patch\na.patch", "listed twice"),
    ],
)
def test_series_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    d = write_series(tmp_path / "p", line + "\n", names=("a.patch",))
    with pytest.raises(PatchError) as err:
        load_series(d)
    assert message in err.value.render()
    assert "series:" in err.value.render()


def test_missing_series_is_empty_but_stray_patches_are_an_error(tmp_path: Path) -> None:
    assert load_series(tmp_path / "nothing").entries == ()
    assert load_series(None).entries == ()
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "x.patch").write_text(PATCH)
    with pytest.raises(PatchError, match="no series file"):
        load_series(tmp_path / "stray")


def test_series_hash_follows_bytes_order_and_selection(tmp_path: Path) -> None:
    d = write_series(tmp_path / "p", "a.patch\nb.patch platform=windows\n")
    s = load_series(d)
    linux, win = PatchContext("linux"), PatchContext("windows")
    h_linux, h_win, h_all = series_hash(s, linux), series_hash(s, win), series_hash(s)
    assert len({h_linux, h_win, h_all}) == 3
    assert series_hash(load_series(d), linux) == h_linux  # stable
    (d / "b.patch").write_text(PATCH.replace("THREE", "Three"))
    assert series_hash(load_series(d), linux) == h_linux  # b is not selected on linux
    assert series_hash(load_series(d), win) != h_win


def test_conditions_and_contexts_take_every_arch_spelling_and_arch_values() -> None:
    # one arch model: the series reads archs through kforge.cuda.arch (strings or Arch values)
    assert Condition("arch", "=", "12.0a").holds(PatchContext("linux", (parse_arch("sm_120a"),)))
    assert Condition("arch", ">=", "compute_100").holds(PatchContext("linux", ("10.3f",)))
    assert not Condition("arch", "=", "120f").holds(PatchContext("linux", (parse_arch("120a"),)))


def test_parse_patch_reads_files_and_hunks(tmp_path: Path) -> None:
    (tmp_path / "x.patch").write_text(PATCH)
    p = parse_patch(tmp_path / "x.patch")
    assert p.subject == "setup: tweak"
    assert [f.path for f in p.files] == ["a.txt", "new.txt"]
    assert p.files[1].old_path is None
    h1, h2 = p.files[0].hunks
    assert (h1.index, h1.old_start, h1.old, h1.new) == (1, 2, ("two", "three", "four"), ("two", "THREE", "four"))
    assert h2.old == ("eight", "nine") and h2.new[-1] == "nine and a half"
    assert p.paths == frozenset({"a.txt", "new.txt"})


def test_analyse_names_the_failing_hunk_and_shows_upstream_lines(tmp_path: Path) -> None:
    (tmp_path / "x.patch").write_text(PATCH)
    p = parse_patch(tmp_path / "x.patch")
    good = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n"
    assert analyse(p, {"a.txt": good.encode()}.get) == ()
    shifted = "zero\n" + good  # an offset is fine (git apply allows it)
    assert analyse(p, {"a.txt": shifted.encode()}.get) == ()
    drifted = good.replace("eight\n", "EIGHT\n")
    (failure,) = analyse(p, {"a.txt": drifted.encode()}.get)
    assert (failure.file, failure.hunk) == ("a.txt", 2)
    assert failure.expected == ("eight", "nine")
    assert failure.actual == ("EIGHT", "nine")
    assert failure.line == 8
    missing = analyse(p, {}.get)
    assert missing[0].file == "a.txt" and "does not exist" in missing[0].reason
    exists = analyse(p, {"a.txt": good.encode(), "new.txt": b"hi\n"}.get)
    assert exists[0].file == "new.txt" and "already exists" in exists[0].reason


def test_real_series_in_the_repo_parse() -> None:
    """The checked-in series (real patches) are well-formed and name existing files."""
    for project in ("flash-attn", "flashmla", "flashinfer"):
        s = load_series(REPO / "patches" / project)
        assert s.entries, project
        for e in s.entries:
            assert parse_patch(e.path).files


def test_patch_touching_paths_outside_the_tree_is_refused(tmp_path: Path) -> None:
    evil = PATCH.replace("a/a.txt", "a/../a.txt").replace("--- a/../a.txt", "--- a/../a.txt")
    (tmp_path / "x.patch").write_text(evil)
    with pytest.raises(PatchError, match="outside the tree"):
        parse_patch(tmp_path / "x.patch")


def test_every_git_series_names_the_pin_it_was_checked_against() -> None:
    """A pin bump without re-checking the series fails here: the header must name the pinned commit."""
    forge = load_forge(Path(__file__).resolve().parents[2])
    checked = 0
    for project in forge.projects.values():
        if project.git is None or project.patches is None or project.source is not project.git:
            continue
        header = "\n".join(load_series(project.patches).header)
        assert project.git.commit in header, f"patches/{project.name}/series does not name {project.git.commit}"
        checked += 1
    assert checked == 4  # flash-attn3 and flash-attn3-standalone (one series), flashmla, flashinfer
