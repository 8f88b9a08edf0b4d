"""End to end with real nvcc: pinned submodule -> scratch export -> patch series -> wheel.

The patched fixture must build, and the built library must carry what the patches added.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import TINY_PATCHES, make_superproject, make_upstream, use_test_git_config  # noqa: E402

from kforge.config.source import GitSource
from kforge.sources import patches  # noqa: E402
from kforge.sources import upstream as sources
from kforge.sources.series import PatchContext, load_series  # noqa: E402

pytestmark = pytest.mark.integration

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda-13.0/bin/nvcc", "/usr/local/cuda/bin/nvcc")
                                     if os.path.exists(p)), None)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_patched_scratch_copy_builds_with_nvcc_and_checkout_stays_pristine(tmp_path: Path, monkeypatch) -> None:
    from elftools.elf.elffile import ELFFile

    use_test_git_config(monkeypatch, tmp_path / "home")
    upstream = tmp_path / "upstream"
    base = make_upstream(upstream)
    root = tmp_path / "mono"
    make_superproject(root, upstream)
    spec = GitSource("externals/tiny", upstream.as_uri(), base)
    checkout_hash = sources.tree_hash(root / "externals" / "tiny")

    prepared = sources.prepare(root, spec, root / ".kforge" / "work" / "tiny-sm120", cache_dir=tmp_path / "cache")
    ctx = PatchContext("linux-x86_64", ("sm_120a",), "0.1.0")
    result = patches.apply(prepared.tree, load_series(TINY_PATCHES), ctx)
    assert len(result.applied) == 3  # 0003 is windows-only

    env = dict(os.environ, TINY_CUDA_ARCHS="120a", TINY_NVCC_FLAGS="-O0",
               CUDA_HOME=str(Path(NVCC).resolve().parent.parent))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                           "-w", str(tmp_path / "dist"), str(prepared.tree)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("tiny_upstream-0.1.0-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        (so_name,) = [n for n in zf.namelist() if n.endswith(".so")]
        so = tmp_path / "lib.so"
        so.write_bytes(zf.read(so_name))
    with open(so, "rb") as fh:
        symbols = {s.name for s in ELFFile(fh).get_section_by_name(".dynsym").iter_symbols()}
    assert {"tiny_scale", "tiny_block_size", "tiny_patched_for_sm120"} <= symbols
    assert b"sm_120a" in so.read_bytes()  # the arch knob reached nvcc
    assert sources.tree_hash(root / "externals" / "tiny") == checkout_hash  # built beside, not in, externals/
