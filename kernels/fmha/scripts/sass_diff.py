"""Compare the SASS of the kernels two builds of libkforge_fmha.so share (cuobjdump -sass), kernel
by kernel: a refactor or a leaner build must leave the kernels it keeps unchanged.

    python kernels/fmha/scripts/sass_diff.py before/libkforge_fmha.so after/libkforge_fmha.so

Prints one line per kernel (same / DIFFERENT / only in A / only in B) and a summary; exit 1 when a
kernel both hold differs. cuobjdump (and nvdisasm beside it) must be on PATH, or CUOBJDUMP set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

_FUNC = re.compile(r"^\s*Function : (\S+)\s*$")


def kernels(lib: str) -> dict[str, str]:
    """Mangled kernel name -> its SASS text (the instruction lines with their encodings,
    addresses kept: each kernel sits in its own section, so identical code prints identically)."""
    exe = os.environ.get("CUOBJDUMP", "cuobjdump")
    out = subprocess.run([exe, "-sass", lib], check=True, capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {}
    name = None
    for line in out.splitlines():
        m = _FUNC.match(line)
        if m:
            name = m.group(1)
            found[name] = []
        elif name is not None and line.strip().startswith(("/*", "..")):
            # whitespace collapsed: cuobjdump pads the encoding column to the widest instruction
            # of the whole file, so the same code prints with other spacing beside other kernels
            found[name].append(" ".join(line.split()))
    return {k: "\n".join(v) for k, v in found.items()}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = kernels(argv[0]), kernels(argv[1])
    same = diff = 0
    for name in sorted(set(a) | set(b)):
        if name not in b:
            status = "only in A"
        elif name not in a:
            status = "only in B"
        elif a[name] == b[name]:
            status, same = "same", same + 1
        else:
            status, diff = "DIFFERENT", diff + 1
        print(f"{status:10s} {name}")
    print(f"kernels: A {len(a)}, B {len(b)}, both {same + diff}: {same} same, {diff} different")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
