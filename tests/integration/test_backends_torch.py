"""The native backend on a real torch CUDA extension (``tests/fixtures/torch_tiny``).

Needs a CUDA build of torch (it skips on the CPU-only CI machine, with the reason) and runs on
the GPU host: torch's own BuildExtension writes the ninja file that ``PYTORCH_NVCC`` hooks
into, and the built op is run on the GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from kforge_testkit import forge_toml

from kforge.backends import BuildRequest, BuildResult, get_backend
from kforge.build.host import detect_host
from kforge.build.profiles import load_profile
from kforge.build.report import parse_ninja_log
from kforge.config.forge import load_forge
from kforge.config.targets import parse_target
from kforge.plan import PlanOptions, make_plan

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "torch_tiny"
FORGE_TOML = forge_toml("""
[projects.tt]
source = { local = "torch_tiny" }
archs = ["sm_90"]
torch_abi = true
build_isolation = false
arch_knobs = [{ env = "TORCH_TINY_ARCHS", format = "numbers" }]
""", torch=())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch = pytest.importorskip("torch", reason="torch_tiny is a torch extension")
    if not torch.version.cuda:
        pytest.skip(f"torch {torch.__version__} is a CPU build: a torch CUDA extension needs a CUDA build of torch")
    environ = dict(os.environ)
    if not environ.get("CUDA_HOME") and Path("/usr/local/cuda/bin/nvcc").is_file():
        environ["CUDA_HOME"] = "/usr/local/cuda"
    host = detect_host(environ)
    if host.nvcc_path is None or host.platform != "linux-x86_64":
        pytest.skip("needs nvcc on a linux-x86_64 host")
    tmp = tmp_path_factory.mktemp("torch_tiny")
    (tmp / "forge.toml").write_text(FORGE_TOML)
    forge = load_forge(tmp)
    target = parse_target(forge, "tt-sm90", host.platform)
    plan = make_plan(forge, target, host, PlanOptions(nvcc_threads=2),
                     job_profile=load_profile(tmp / "cache", target.project, 1))
    tree = tmp / "tree"
    shutil.copytree(FIXTURE, tree)
    request = BuildRequest(plan=plan, tree=tree, out_dir=tmp / "out", work_dir=tmp / "work",
                           env={**environ, **plan.env}, python=sys.executable,
                           forge_pythons=tuple(forge.toolchains.python), progress=True)
    mp = pytest.MonkeyPatch()
    import io

    err = io.StringIO()
    mp.setattr(sys, "stderr", err)
    try:
        result = get_backend("native").build(request)
    finally:
        mp.undo()
    return tmp, plan, result, err.getvalue()


def test_torch_extension_wheel_ninja_log_units_and_progress(built):
    tmp, plan, result, err = built
    assert isinstance(result, BuildResult)
    assert re.fullmatch(r"torch_tiny-0\.1\.0-cp3\d+-cp3\d+-linux_x86_64\.whl", result.artifact.name)
    with zipfile.ZipFile(result.artifact) as zf:
        assert any(re.fullmatch(r"torch_tiny/_C\..*\.so", n) for n in zf.namelist())

    assert re.search(r"building tt-sm90: (\d+)/\1 units, \d+:\d\d elapsed, ETA 0:00", err), err

    (ninja_log,) = result.ninja_logs  # torch's BuildExtension: build/temp.*/.ninja_log in the tree
    assert ninja_log.parent.parent == (tmp / "tree" / "build").resolve()
    outputs = {Path(e.output).name: e for e in parse_ninja_log(ninja_log)}
    assert {"add_one.o", "ops.o"} <= set(outputs)

    # the .cu unit went through PYTORCH_NVCC -> kforge's measurer -> nvcc, with the plan's threads
    units = {Path(u.output).name: u for u in result.units}
    assert set(units) == {"add_one.o"}  # ops.cpp is compiled by the host compiler, not nvcc
    unit = units["add_one.o"]
    assert unit.returncode == 0 and unit.nvcc_threads == plan.jobs.nvcc_threads == 2
    assert unit.peak_rss > 100 * 2**20  # torch headers make even a tiny unit big
    assert result.peak_rss > 100 * 2**20 and result.seconds > unit.seconds * 0.5
    print(f"torch_tiny build: {result.seconds:.1f} s, peak {result.peak_rss / 2**20:.0f} MiB; "
          f"add_one.cu {unit.seconds:.1f} s, {unit.peak_rss / 2**20:.0f} MiB")


@pytest.mark.gpu
def test_the_built_op_runs_on_the_gpu(built, tmp_path):
    import torch

    if not torch.cuda.is_available():
        if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
            pytest.fail("KFORGE_REQUIRE_GPU=1 but torch sees no GPU")
        pytest.skip("no GPU visible to torch")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        pytest.skip(f"the wheel carries sm_90 SASS only; this GPU is sm_{major}{minor}")
    _, _, result, _ = built
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(result.artifact)], check=True)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, torch_tiny; "
            "print(torch_tiny.add_one(torch.arange(4.0, device='cuda')).tolist())")
    out = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[1.0, 2.0, 3.0, 4.0]"
