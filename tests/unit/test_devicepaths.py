"""kforge.cuda.devicepaths: the host-compiler shim carries its defaults (the mapping itself: test_nvccwrap.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kforge.cuda.devicepaths import HOSTCC_ENV, MAPS_ENV, ensure_shim


def test_shim_carries_the_real_compiler_and_maps_for_callers_without_them(tmp_path: Path) -> None:
    # sccache launched outside kforge's nvcc wrapper (CMake) runs nvcc's steps with its client's environment
    maps = json.dumps([["/a b", "/kforge"]])
    shim = ensure_shim(str(tmp_path), "c++", python="/bin/sh", boot="-c",
                       env={HOSTCC_ENV: "/usr/bin/c++", MAPS_ENV: maps})
    text = Path(shim).read_text().replace('exec /bin/sh -I -c --host-compiler "$0" "$@"',
                                          f'echo "${HOSTCC_ENV}|${MAPS_ENV}"')
    Path(shim).write_text(text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    assert subprocess.run([shim], env=clean, capture_output=True, text=True).stdout.strip() == f"/usr/bin/c++|{maps}"
    mine = {**clean, HOSTCC_ENV: "/opt/g++"}  # the wrapper's own environment still wins
    assert subprocess.run([shim], env=mine, capture_output=True, text=True).stdout.strip().startswith("/opt/g++|")
