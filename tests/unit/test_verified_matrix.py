"""The matrix of what has been built: every declared target once per profile, its status from kforge runs only,
and the reasons kforge already knows a target cannot build here."""

from __future__ import annotations

import sys
from pathlib import Path

import kforge_testkit
import pytest

from kforge.config.forge import load_forge
from kforge.config.targets import expand_matrix
from kforge.errors import TargetError
from kforge.verified.matrix import build_rows, counts, unbuildable_reason
from kforge.verified.records import RECORDS_FILE, load_runs, load_unfit, parse_runs, parse_unfit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
HOST = "linux-x86_64"

PROJECTS = """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a"]
arch_sets = { release = ["sm_80", "sm_90a"] }
platforms = ["linux-x86_64", "linux-aarch64", "windows-amd64"]
[projects.demo.profiles.full]
env = {}
[projects.demo.profiles.small]
env = { DEMO_SMALL = "1" }

[projects.plain]
source = { local = "kernels/plain" }
archs = ["sm_90a", "sm_110a", "sm_120"]
unbuildable = { sm_90a = "needs a kernel port" }

[matrix]
exclude = [{ project = "demo", platform = "linux-aarch64", arch = ["sm_80"] }]
"""


def run(
    target: str,
    status: str = "gpu-tested",
    *,
    via: str = "kforge",
    profile: str | None = None,
    date: str = "2026-11-23",
    time: str | None = None,
    device: str = "NVIDIA H200",
) -> str:
    return (
        f'[[run]]\ntarget = "{target}"\nvia = "{via}"\nstatus = "{status}"\nhost = "h"\ndevice = "{device}"\n'
        f'date = "{date}"\nsection = "s"\n'
        + (f'profile = "{profile}"\n' if profile else "")
        + (f'time = "{time}"\n' if time else "")
    )


@pytest.fixture()
def forge(tmp_path: Path):
    kforge_testkit.write_forge_toml(tmp_path, PROJECTS, cuda=("13.0", "12.8"), arm=True, windows=True)
    return load_forge(tmp_path)


def rows_of(forge, *runs: str, here: str = HOST):
    data = tomllib.loads("".join(runs))
    parsed = parse_runs(forge, data, forge.root / RECORDS_FILE)
    unfit = parse_unfit(forge, data, forge.root / RECORDS_FILE)
    return {(r.target.id, r.profile): r for r in build_rows(forge, parsed, here, unfit)}


def unfit(target: str, profile: str = "full", why: str = "extrapolated 40 min") -> str:
    return (f'[[unfit]]\ntarget = "{target}"\nprofile = "{profile}"\nhost = "x4"\nwhy = "{why}"\n'
            'section = "times.md"\n')


def test_every_declared_target_is_a_row_once_per_profile(forge) -> None:
    rows = rows_of(forge)
    targets = expand_matrix(forge, HOST)
    expected = {(t.id, p) for t in targets for p in (("full", "small") if t.project == "demo" else (None,))}
    assert set(rows) == expected and len(rows) == len(expected)
    assert ("demo-release-windows", "small") in rows and ("demo-sm80-linux-arm", "full") not in rows  # excluded
    assert all(r.status == "planned" for (tid, _), r in rows.items() if tid in ("demo-sm80", "demo-release"))


def test_the_best_kforge_run_sets_the_status_and_outside_runs_never_do(forge) -> None:
    rows = rows_of(
        forge,
        run("demo-sm90", "built-doctor", date="2026-11-21"),
        run("demo-sm90", "gpu-tested", time="01:00", device="NVIDIA H100 80GB HBM3"),
        run("demo-sm90", "gpu-tested", time="02:00"),
        run("demo-sm90", "failed", date="2026-11-27"),
        run("demo-sm80", "gpu-tested", via="cmake"),
        run("demo-sm80", "built-doctor", profile="small"),
        run("demo-sm90", "failed", profile="small"),
    )
    full = rows[("demo-sm90", "full")]
    assert full.status == "gpu-tested" and full.label == "GPU-tested on NVIDIA H100 80GB HBM3, NVIDIA H200"
    assert full.best.time == "02:00" and [r.date for r in full.runs] == [
        "2026-11-21",
        "2026-11-23",
        "2026-11-23",
        "2026-11-27",
    ]
    assert rows[("demo-sm90", "small")].status == "planned"  # a failed run alone is no build
    assert rows[("demo-sm80", "small")].label == "built + doctor"
    sm80 = rows[("demo-sm80", "full")]
    assert sm80.status == "planned" and [r.via for r in sm80.outside] == ["cmake"]  # shown, not counted
    assert [r.via for r in rows[("demo-sm80", "small")].outside] == ["cmake"]  # no profile: every profile's row


def test_other_hosts_and_forge_tomls_unbuildable_archs_are_unbuildable_here(forge) -> None:
    rows = rows_of(forge)
    assert rows[("demo-sm90-windows", "full")].label == "unbuildable here: needs a windows-amd64 host"
    assert rows[("demo-sm90-linux-arm", "small")].reason == "needs a linux-aarch64 host"
    assert rows[("plain-sm90", None)].label == "unbuildable here: needs a kernel port (forge.toml: sm_90a unbuildable)"
    # seen from Windows, the Linux targets need another host and the Windows ones do not
    from_windows = rows_of(forge, here="windows-amd64")
    assert from_windows[("demo-sm90", "full")].reason is None
    assert from_windows[("demo-sm90-linux", "full")].reason == "needs a linux-x86_64 host"


def test_a_run_beats_unbuildable_here(forge) -> None:
    rows = rows_of(forge, run("demo-sm90-windows", "built-doctor"))
    assert rows[("demo-sm90-windows", "full")].status == "built-doctor"


def test_archs_no_declared_cuda_compiles_are_unbuildable(tmp_path: Path) -> None:
    kforge_testkit.write_forge_toml(tmp_path, PROJECTS, cuda=("12.9", "12.8"), arm=True, windows=True)
    forge = load_forge(tmp_path)
    (target,) = [t for t in expand_matrix(forge, HOST) if t.id == "plain-sm110"]
    reason = unbuildable_reason(forge, forge.projects["plain"], target, HOST)
    assert reason.startswith("no CUDA of forge.toml's toolchains (12.9, 12.8) builds it: sm_110a needs CUDA 13.0")


def test_a_pin_outside_the_checked_knobs_is_unbuildable(tmp_path: Path) -> None:
    kforge_testkit.write_forge_toml(
        tmp_path,
        """
[projects.old]
source = { local = "kernels/old" }
archs = ["sm_90a"]
upstream_version = "2.0"
knobs_valid_for = "==1.0"
""",
    )
    forge = load_forge(tmp_path)
    (target,) = expand_matrix(forge, HOST)
    assert "checked for upstream ==1.0" in unbuildable_reason(forge, forge.projects["old"], target, HOST)


def test_a_run_of_a_build_the_matrix_does_not_list_is_an_error(forge) -> None:
    with pytest.raises(TargetError) as err:
        rows_of(forge, run("plain-sm120f"))  # an explicit variant: a build of its own, no row of the matrix
    assert "run[0]" in err.value.render() and "no row of the matrix" in err.value.render()


def test_the_committed_matrix_has_every_declared_target_and_the_verified_ones() -> None:
    forge = load_forge(ROOT)
    rows = build_rows(forge, load_runs(forge), HOST)
    ids = {r.target.id for r in rows}
    assert ids == {t.id for t in expand_matrix(forge, HOST)}
    by = {(r.target.id, r.profile): r for r in rows}
    assert by[("fmha-sm90", None)].status == "gpu-tested"
    assert by[("flash-attn3-sm90", "minimal")].status == "gpu-tested"
    assert by[("flash-attn3-standalone-sm90", "full")].status == "planned"  # verified.md: not built
    # every planned Linux x86_64 row of the committed matrix says why it does not fit one GPU run (issue 33)
    with_why = {(r.target.id, r.profile): r for r in build_rows(forge, load_runs(forge), HOST, load_unfit(forge))}
    planned = [r for r in with_why.values() if r.status == "planned" and r.target.platform == HOST]
    assert planned and all(r.unfit is not None and "does not fit one GPU run" in r.label for r in planned)
    assert by[("flashmla-sm120", "full")].status == "built-doctor"  # no sm_120 GPU
    assert by[("flashmla-sm120-windows", "full")].status == "unbuildable"
    assert sum(counts(rows).values()) == len(rows)


def test_an_unfit_record_says_why_a_planned_row_is_not_built(forge) -> None:
    rows = rows_of(forge, unfit("demo-sm90", "small", "a run wrote 68 of 233 objects in 600 s"))
    row = rows[("demo-sm90", "small")]
    assert row.status == "planned" and row.unfit is not None
    assert row.label == ("planned only: does not fit one GPU run on x4: a run wrote 68 of 233 objects in 600 s "
                         "(times.md)")
    assert rows[("demo-sm90", "full")].label == "planned only"  # the other profile: no record, no reason


def test_an_unfit_record_for_a_built_row_is_stale(forge) -> None:
    with pytest.raises(TargetError) as err:
        rows_of(forge, run("demo-sm90", profile="small"), unfit("demo-sm90", "small"))
    text = err.value.render()
    assert "unfit[0]" in text and "gpu-tested" in text and "remove unfit[0]" in text.lower()


def test_an_unfit_record_of_no_row_or_bad_text_is_an_error(forge) -> None:
    with pytest.raises(TargetError) as err:
        rows_of(forge, unfit("demo-sm90-linux-arm"))  # excluded by [matrix]: no row
    assert "unfit[0]" in err.value.render()
    with pytest.raises(TargetError) as twice:
        rows_of(forge, unfit("demo-sm90"), unfit("demo-sm90"))
    assert "unfit[1]" in twice.value.render() and "unfit[0] already explains" in twice.value.render()
    with pytest.raises(Exception) as bad:
        rows_of(forge, unfit("demo-sm90", why="a | b"))
    assert "unfit[0].why" in str(bad.value.render())
