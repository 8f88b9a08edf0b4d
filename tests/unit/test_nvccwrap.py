"""kforge.cuda.nvccwrap: every spelling of nvcc's arch flags rewritten to the plan's; host-only steps untouched; device
paths mapped by the plan's prefix maps (relative .cu inputs, a host-compiler shim that maps line markers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kforge.cuda.devicepaths import companion, map_line_markers, map_path, real_compiler, toolkit_maps
from kforge.cuda.nvccwrap import (
    Config,
    Policy,
    fold_env_flags,
    main,
    map_device_step,
    policy_from_flags,
    rewrite,
    short_dependency_flags,
    split_gencode,
    splits_ptxas,
)

SM90 = policy_from_flags(["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"], threads=2)
PLAN_FLAGS = ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90", "--threads", "2"]
TWO = policy_from_flags(["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_120a,code=sm_120a",
                         "-gencode=arch=compute_120a,code=compute_120a"])


def test_policy_from_the_plans_flags() -> None:
    assert [(a.virtual, a.sass, a.ptx, a.key) for a in TWO.archs] == [
        ("compute_80", "sm_80", False, "80"), ("compute_120a", "sm_120a", True, "120")]
    assert TWO.codes == ("sm_80", "sm_120a", "compute_120a")
    with pytest.raises(ValueError, match="not a -gencode flag"):
        policy_from_flags(["-O3"])
    with pytest.raises(ValueError, match="mode"):
        policy_from_flags([], mode="maybe")


@pytest.mark.parametrize("value, expected", [
    ("arch=compute_90,code=sm_90", ("compute_90", ("sm_90",))),
    ("arch=compute_90a,code=[sm_90a,compute_90a]", ("compute_90a", ("sm_90a", "compute_90a"))),
    ('arch=compute_100f,code="sm_100f,compute_100f"', ("compute_100f", ("sm_100f", "compute_100f"))),
])
def test_split_gencode(value: str, expected: tuple[str, tuple[str, ...]]) -> None:
    assert split_gencode(value) == expected


@pytest.mark.parametrize("flags, asked", [
    (["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_80,code=sm_80",
      "-gencode", "arch=compute_90,code=sm_90"], ("sm_75", "sm_80", "sm_90")),
    (["-gencode=arch=compute_75,code=sm_75", "-gencode=arch=compute_90,code=[sm_90,compute_90]"],
     ("sm_75", "sm_90", "compute_90")),
    (["--generate-code=arch=compute_80,code=sm_80"], ("sm_80",)),
    (["--generate-code", "arch=compute_80,code=sm_80"], ("sm_80",)),
    (["-arch=sm_90"], ("sm_90", "compute_90")),
    (["-arch", "sm_90a"], ("sm_90a", "compute_90a")),
    (["--gpu-architecture=compute_90"], ("compute_90",)),
    (["--gpu-architecture", "compute_80", "--gpu-code", "sm_80,sm_86"], ("sm_80", "sm_86")),
    (["-arch=compute_90", "-code=sm_90,compute_90"], ("sm_90", "compute_90")),
    (["-arch=all-major"], ("all-major",)),
    ([], ("nvcc default",)),
])
def test_every_spelling_becomes_the_plans_archs(flags: list[str], asked: tuple[str, ...]) -> None:
    argv = ["-c", "k.cu", "-o", "k.o", "-O3", *flags]
    r = rewrite(argv, SM90)
    assert r.device and r.asked == asked
    assert r.argv == ("-c", "k.cu", "-o", "k.o", "-O3", *PLAN_FLAGS)
    assert r.got == ("sm_90", "compute_90")
    assert r.changed == (set(asked) != {"sm_90", "compute_90"})


def test_a_step_asking_exactly_the_plan_is_not_a_change() -> None:
    r = rewrite(["-c", "k.cu", *PLAN_FLAGS], SM90)
    assert r.device and not r.changed and r.argv == ("-c", "k.cu", *PLAN_FLAGS)


def test_threads_in_every_spelling_become_the_plans() -> None:
    for spelling in (["--threads", "4"], ["--threads=4"], ["-t", "4"], ["-t=4"]):
        r = rewrite(["-c", "k.cu", "-gencode=arch=compute_90,code=[sm_90,compute_90]", *spelling], SM90)
        assert r.threads_asked == 4 and r.threads_got == 2 and r.changed, spelling
        assert r.argv[-2:] == ("--threads", "2") and "4" not in r.argv


def test_per_file_split_survives_and_a_foreign_list_gets_every_plan_arch() -> None:
    # FA3-style: this unit is compiled for sm_80 only; the plan has sm_80 and sm_120a: it keeps sm_80
    r = rewrite(["-c", "flash_sm80.cu", "-gencode", "arch=compute_80,code=sm_80"], TWO)
    assert r.got == ("sm_80",) and not r.changed
    # asked for 120 (plain): it gets the plan's spelling of 120, sm_120a + PTX
    r = rewrite(["-c", "k.cu", "-arch=sm_120"], TWO)
    assert r.got == ("sm_120a", "compute_120a")
    # asked for none of the plan's archs: every plan arch
    r = rewrite(["-c", "k.cu", "-gencode", "arch=compute_75,code=sm_75"], TWO)
    assert r.got == ("sm_80", "sm_120a", "compute_120a")


@pytest.mark.parametrize("argv", [
    ["--version"], ["-V"], ["--list-gpu-arch"], ["-E", "k.cu", "-arch=sm_80"], ["-M", "k.cu", "-arch=sm_80"],
    ["-MM", "k.cu"], ["--generate-dependencies", "k.cu"], ["-c", "host.cpp", "-arch=sm_80"],
    ["-lib", "a.o", "b.o", "-o", "libx.a"], ["-arch=sm_80"],
])
def test_host_only_steps_pass_untouched(argv: list[str]) -> None:
    r = rewrite(argv, SM90)
    assert r.argv == tuple(argv) and not r.device and not r.changed


def test_nvcc_driven_link_is_a_device_step() -> None:
    # nvcc links a registration stub built for the link's archs (sm_75 when none is given, nvcc 13.0)
    r = rewrite(["-shared", "a.o", "b.o", "-o", "lib.so"], SM90)
    assert r.device and r.asked == ("nvcc default",) and r.got == ("sm_90", "compute_90")
    # a -x cu compile of a .cpp file is CUDA; -Xcompiler values are not inputs or flags
    r = rewrite(["-x", "cu", "-c", "k.cpp", "-Xcompiler", "-fPIC", "-arch=sm_80"], SM90)
    assert r.device and r.argv[:6] == ("-x", "cu", "-c", "k.cpp", "-Xcompiler", "-fPIC")
    assert rewrite(["-dc", "k.o.cu"], SM90).device


def test_check_and_off_modes_run_the_command_as_given() -> None:
    argv = ["-c", "k.cu", "-gencode", "arch=compute_75,code=sm_75"]
    check = rewrite(argv, Policy(mode="check", archs=SM90.archs, threads=2))
    assert check.argv == tuple(argv) and check.changed and check.got == ("sm_90", "compute_90")
    off = rewrite(argv, Policy(mode="off", archs=SM90.archs))
    assert off.argv == tuple(argv) and not off.changed


def test_env_flags_are_folded_and_short_dependency_spelling() -> None:
    env = {"NVCC_PREPEND_FLAGS": "-O2", "NVCC_APPEND_FLAGS": "-gencode arch=compute_120a,code=sm_120a"}
    assert fold_env_flags(["-c", "k.cu"], env) == ["-O2", "-c", "k.cu", "-gencode", "arch=compute_120a,code=sm_120a"]
    assert short_dependency_flags(["--generate-dependencies-with-compile", "--dependency-output", "k.d", "-c",
                                   "k.cu", "--dependency-output=x.d"]) == ["-MD", "-MF", "k.d", "-c", "k.cu", "-MF", "x.d"]


def test_config_round_trips_through_json() -> None:
    config = Config(policy=TWO, nvcc="/cuda/bin/nvcc", launcher="/usr/bin/ccache", log="/w/r.jsonl", short_deps=True)
    assert Config.from_json(config.to_json()) == config
    split = Config(policy=policy_from_flags(PLAN_FLAGS[:2], threads=2, ptxas_threads=4), nvcc="/cuda/bin/nvcc")
    assert Config.from_json(split.to_json()).policy.ptxas_threads == 4


SPLIT4 = policy_from_flags(PLAN_FLAGS[:2], threads=2, ptxas_threads=4)


def test_ptxas_threads_reach_every_device_step_once() -> None:
    r = rewrite(["-c", "k.cu", "-arch=sm_80"], SPLIT4)
    assert r.argv[-2:] == ("-Xptxas", "--split-compile=4") and r.ptxas_threads == 4
    assert rewrite(["-shared", "a.o", "-o", "lib.so"], SPLIT4).ptxas_threads == 4  # nvcc-driven link: a device step
    # host-only steps, one thread, check mode: nothing added
    assert "-Xptxas" not in rewrite(["-E", "k.cu"], SPLIT4).argv
    assert rewrite(["-ptx", "k.cu"], SPLIT4).ptxas_threads is None  # PTX only: no ptxas runs
    assert "-Xptxas" not in rewrite(["-c", "k.cu"], SM90).argv
    check = rewrite(["-c", "k.cu"], Policy(mode="check", archs=SM90.archs, ptxas_threads=4))
    assert check.argv == ("-c", "k.cu")
    assert rewrite(["-c", "k.cu"], policy_from_flags(PLAN_FLAGS[:2], ptxas_threads=1)).ptxas_threads is None


@pytest.mark.parametrize("own", [["--split-compile=2"], ["-split-compile", "0"], ["-Xptxas", "--split-compile=8"],
                                 ["-Xptxas=-v,--split-compile=8"], ["--ptxas-options=--split-compile,8"]])
def test_a_step_that_splits_by_its_own_flags_keeps_them(own: list[str]) -> None:
    assert splits_ptxas(own)
    r = rewrite(["-c", "k.cu", *own], SPLIT4)
    assert r.ptxas_threads is None and "--split-compile=4" not in r.argv
    assert not splits_ptxas(["-Xptxas", "-v", "-c", "split-compile.cu"])


def test_main_rewrites_logs_and_execs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr("os.execvpe", lambda exe, argv, env: ran.append((exe, list(argv), dict(env))))
    log = tmp_path / "rewrites.jsonl"
    config = Config(policy=SM90, nvcc="/cuda/bin/nvcc", launcher="/usr/bin/ccache", log=str(log))
    env = {"NVCC_APPEND_FLAGS": "-gencode arch=compute_75,code=sm_75", "PATH": "/usr/bin"}
    assert main([config.to_json(), "-c", "k.cu", "-o", "k.o"], env) == 0
    exe, argv, child_env = ran[0]
    assert exe == "/usr/bin/ccache" and argv == ["/usr/bin/ccache", "/cuda/bin/nvcc", "-c", "k.cu", "-o", "k.o", *PLAN_FLAGS]
    assert "NVCC_APPEND_FLAGS" not in child_env  # folded in and enforced, not re-added by nvcc
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["asked"] == ["sm_75"] and entry["got"] == ["sm_90", "compute_90"] and entry["inputs"] == ["k.cu"]
    # a host-only step: no log line, untouched
    assert main([config.to_json(), "--version"], {}) == 0
    assert ran[-1][1] == ["/usr/bin/ccache", "/cuda/bin/nvcc", "--version"] and len(log.read_text().splitlines()) == 1
    assert main([], {}) == 2
    # the build's NVCC_THREADS (an OOM retry halves it) wins over the plan's count
    assert main([config.to_json(), "-c", "k.cu", "-t", "8"], {"NVCC_THREADS": "1"}) == 0
    assert ran[-1][1][-2:] == ["--threads", "1"]


MAPS = (("/tmp/a/x", "/kforge"),)


def test_paths_are_mapped_by_the_longest_matching_folder() -> None:
    maps = (("/w", "/kforge"), ("/w/.cache", "/cache"))
    assert map_path("/w/src/a.cu", maps) == "/kforge/src/a.cu" and map_path("/w", maps) == "/kforge"
    assert map_path("/w/.cache/inc/x.h", maps) == "/cache/inc/x.h"
    assert map_path("/wx/a.cu", maps) == "/wx/a.cu" and map_path("/usr/include/a.h", maps) == "/usr/include/a.h"


def test_line_markers_are_mapped_and_relative_ones_read_against_the_folder() -> None:
    text = ('# 0 "/tmp/a/x/.kforge/work/t/src/k.cu"\n# 0 "<built-in>"\n# 1 "/usr/include/stdc-predef.h" 1 3 4\n'
            '# 12 "../src/h.cuh" 2\n#line 7 "/tmp/a/x/src/k.cu"\nconst char* f = "/tmp/a/x/not-a-marker";\n'
            '# 3 "rel.h"\n')
    out = map_line_markers(text, MAPS, "/tmp/a/x/build")
    assert out == ('# 0 "/kforge/.kforge/work/t/src/k.cu"\n# 0 "<built-in>"\n# 1 "/usr/include/stdc-predef.h" 1 3 4\n'
                   '# 12 "/kforge/src/h.cuh" 2\n#line 7 "/kforge/src/k.cu"\nconst char* f = "/tmp/a/x/not-a-marker";\n'
                   '# 3 "/kforge/build/rel.h"\n')
    assert map_line_markers('# 3 "rel.h"\n', MAPS, "/elsewhere") == '# 3 "rel.h"\n'  # outside every map: as it was


def test_a_device_step_gets_relative_inputs_and_the_shim_for_the_host_compiler() -> None:
    argv = ["-ccbin", "/usr/bin/g++-12", "-I/tmp/a/x/src", "-c", "/tmp/a/x/src/k.cu", "-o", "/tmp/a/x/b/k.o",
            "-MF", "/tmp/a/x/src/dep.cu", "/other/z.cu"]
    out, env, name = map_device_step(argv, MAPS, "/tmp/a/x/b", "/shims", {})
    assert out == ["-I/tmp/a/x/src", "-c", "../src/k.cu", "-o", "/tmp/a/x/b/k.o", "-MF", "/tmp/a/x/src/dep.cu",
                   "/other/z.cu", "-ccbin", "/shims/g++-12"]  # two inputs: cudafe++'s path is left to nvcc
    assert name == "g++-12" and env["KFORGE_HOSTCC"] == "/usr/bin/g++-12" and json.loads(env["KFORGE_PATH_MAPS"]) == [list(MAPS[0])]
    # nvcc's default host compiler, NVCC_CCBIN, and a step whose folder is outside the map (inputs stay absolute)
    out, env, name = map_device_step(["-c", "/tmp/a/x/k.cu"], MAPS, "/elsewhere", "/shims", {})
    assert out == ["-c", "/tmp/a/x/k.cu", "-Xcudafe", "--orig_src_path_name=/kforge/k.cu", "-ccbin", "/shims/gcc"]
    assert env["KFORGE_HOSTCC"] == "gcc"
    # a relative input (setuptools builds in the tree): cudafe++ still gets the mapped absolute path
    assert map_device_step(["-c", "csrc/k.cu"], MAPS, "/tmp/a/x/p", "/s", {})[0][:4] == [
        "-c", "csrc/k.cu", "-Xcudafe", "--orig_src_path_name=/kforge/p/csrc/k.cu"]
    assert "-Xcudafe" not in map_device_step(["-c", "/other/k.cu"], MAPS, "/tmp/a/x", "/s", {})[0]
    _, env, _ = map_device_step(["--compiler-bindir=clang++", "-c", "k.cu"], MAPS, "/tmp/a/x", "/s", {"NVCC_CCBIN": "g++"})
    assert env["KFORGE_HOSTCC"] == "clang++"
    assert map_device_step(["-c", "k.cu"], MAPS, "/tmp/a/x", "/s", {"NVCC_CCBIN": "g++"})[1]["KFORGE_HOSTCC"] == "g++"


def test_the_wrapper_maps_device_steps_and_the_shim_maps_what_it_preprocesses(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr("os.execvpe", lambda exe, argv, env: ran.append((exe, list(argv), dict(env))))
    root, build = tmp_path / "ck", tmp_path / "ck" / "build"
    build.mkdir(parents=True)
    monkeypatch.chdir(build)
    config = Config(policy=SM90, nvcc="/cuda/bin/nvcc", log=None, path_maps=((str(root), "/kforge"),),
                    shim_dir=str(tmp_path / "hostcc"), boot=str(tmp_path / "boot.py"))
    assert Config.from_json(config.to_json()) == config
    env = {"NVCC_APPEND_FLAGS": "-frandom-seed=k", "NVCC_CCBIN": "g++"}
    assert main([config.to_json(), "-c", str(root / "src" / "k.cu"), "-o", "k.o"], env) == 0
    _, argv, child_env = ran[-1]
    assert argv == ["/cuda/bin/nvcc", "-c", "../src/k.cu", "-o", "k.o", "-frandom-seed=k", *PLAN_FLAGS,
                    "-Xcudafe", "--orig_src_path_name=/kforge/src/k.cu", "-ccbin", str(tmp_path / "hostcc" / "g++")]
    assert "NVCC_CCBIN" not in child_env and "NVCC_APPEND_FLAGS" not in child_env and child_env["KFORGE_HOSTCC"] == "g++"
    # the shim maps the checkout and the folder of the toolkit nvcc runs from (ptxas reads its headers' times)
    assert json.loads(child_env["KFORGE_PATH_MAPS"]) == [[str(root), "/kforge"], ["/cuda", "/kforge-cuda"]]
    shim = (tmp_path / "hostcc" / "g++").read_text()
    assert os.access(tmp_path / "hostcc" / "g++", os.X_OK) and '--host-compiler "$0"' in shim and "boot.py" in shim
    main([config.to_json(), "-ccbin", "/opt/gcc-12", "-c", str(root / "src" / "k.cu")], env)
    assert {p.name for p in (tmp_path / "hostcc").iterdir()} == {"g++", "gcc-12", "g++-12"}  # nvcc links with g++-12
    assert main([config.to_json(), "--version"], env) == 0 and ran[-1][1] == ["/cuda/bin/nvcc", "--version"]
    # the shim: a fake compiler that preprocesses (writes line markers under the checkout) through the real path
    fake = tmp_path / "fakecc.py"
    fake.write_text("import sys\nout = sys.argv[sys.argv.index('-o') + 1]\n"
                    f"open(out, 'w').write('# 1 \"{root}/src/k.cu\"\\n# 2 \"../src/h.cuh\" 1\\nint x;\\n')\n")
    shim_env = {"KFORGE_HOSTCC": sys.executable, "KFORGE_PATH_MAPS": json.dumps([[str(root), "/kforge"]])}
    python = Path(sys.executable).name
    assert main(["--host-compiler", f"/s/{python}", str(fake), "-E", "-x", "c++", "k.cu", "-o", str(build / "k.ii")],
                shim_env) == 0
    assert (build / "k.ii").read_text() == '# 1 "/kforge/src/k.cu"\n# 2 "/kforge/src/h.cuh" 1\nint x;\n'
    # a compile (no -E) is left as the compiler wrote it; a failing compiler's status comes through
    assert main(["--host-compiler", f"/s/{python}", str(fake), "-c", "k.cu", "-o", str(build / "k.o")], shim_env) == 0
    assert (build / "k.o").read_text().startswith(f'# 1 "{root}/src/k.cu"')
    assert main(["--host-compiler", f"/s/{python}", "-c", "raise SystemExit(3)"], shim_env) == 3
    assert main(["--host-compiler"], shim_env) == 2


def test_a_shim_runs_the_real_compiler_or_its_sibling_of_the_shims_name() -> None:
    assert real_compiler("/shims/gcc-12", "/opt/bin/gcc-12") == "/opt/bin/gcc-12"
    assert real_compiler("/shims/g++-12", "/opt/bin/gcc-12") == "/opt/bin/g++-12"
    assert real_compiler("/shims/g++", "gcc") == "g++"
    assert [companion(n) for n in ("gcc", "gcc-12", "clang", "clang++", "cc", "icpx")] == [
        "g++", "g++-12", "clang++", None, "c++", None]


@pytest.mark.parametrize(("ptx", "whole", "sm80_only"), [
    # none: no step gets PTX, even one that asked for it (-arch=sm_80 means SASS sm_80 + PTX compute_80 to nvcc)
    (False, ("sm_80", "sm_120"), ("sm_80",)),
    # highest: only the highest arch's PTX; a per-file split that builds sm_80 alone gets none
    ("last", ("sm_80", "sm_120", "compute_120"), ("sm_80",)),
    # all: every arch's PTX, in every step that builds that arch
    (True, ("sm_80", "compute_80", "sm_120", "compute_120"), ("sm_80", "compute_80")),
])
def test_the_wrapper_applies_the_plans_ptx_policy(ptx, whole, sm80_only) -> None:
    """The plan renders its -gencode flags with the PTX policy (kforge.config.binarypolicy); the wrapper enforces them."""
    from kforge.cuda.arch import parse_arch_list
    from kforge.cuda.render import render_gencode

    policy = policy_from_flags(render_gencode(parse_arch_list("80;120"), ptx=ptx))
    assert rewrite(["-c", "k.cu", "-o", "k.o"], policy).got == whole  # no arch flag: every plan arch
    one = rewrite(["-c", "k_sm80.cu", "-o", "k.o", "-arch=sm_80"], policy)
    assert one.asked == ("sm_80", "compute_80") and one.got == sm80_only
    assert [w for w in one.argv if "compute_" in w and "code=compute_" in w] == (
        ["-gencode=arch=compute_80,code=compute_80"] if "compute_80" in sm80_only else [])


def test_the_toolkit_folder_and_its_real_path_are_mapped(tmp_path: Path) -> None:
    real = tmp_path / "cuda-13.0"
    (real / "bin").mkdir(parents=True)
    (tmp_path / "cuda").symlink_to(real)
    assert toolkit_maps(str(real / "bin" / "nvcc")) == ((str(real), "/kforge-cuda"),)
    assert toolkit_maps(str(tmp_path / "cuda" / "bin" / "nvcc")) == ((str(tmp_path / "cuda"), "/kforge-cuda"),
                                                                     (str(real), "/kforge-cuda"))
    # a bare name, or an nvcc outside a bin folder: nothing to map
    assert toolkit_maps("nvcc") == () and toolkit_maps("/opt/nvcc") == () and toolkit_maps("/bin/nvcc") == ()
    line = '# 1 "/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include/cuda_fp16.hpp" 1\n'
    assert map_line_markers(line, toolkit_maps("/usr/local/cuda-13.0/bin/nvcc"), "/w") == (
        '# 1 "/kforge-cuda/bin/../targets/x86_64-linux/include/cuda_fp16.hpp" 1\n')
