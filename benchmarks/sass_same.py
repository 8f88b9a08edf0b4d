"""Check: do the parts of a cut unit hold exactly the kernels of the whole unit, with the same SASS?

Used for flash-attn's patch 0005 (forge.toml ``unit_split``): compile a whole unit and its parts with the same flags,
then::

    python benchmarks/sass_same.py WHOLE.o PART.o [PART.o ...]

It reads every object's SASS with ``cuobjdump -sass`` (PyPI: nvidia-cuda-cuobjdump), one text per kernel, and
compares the whole unit's kernels with the union of the parts' (whitespace normalised: cuobjdump pads columns to
the widest instruction of the file). A kernel may be in two parts (flash-attn's backward parts both hold the
preprocess and convert kernels of their traits, as two of upstream's own units hold the same combine kernels), with
the same SASS in each. Exit 0 when the kernel sets are equal and every kernel's SASS is the same everywhere; 1
otherwise, naming what differs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys


def kernels(obj: str) -> dict[str, str]:
    out = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            current = m.group(1)
            found[current] = []
        elif current is not None:
            found[current].append(" ".join(line.split()))
    return {name: "\n".join(lines) for name, lines in found.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("whole")
    ap.add_argument("parts", nargs="+")
    args = ap.parse_args(argv)
    whole = kernels(args.whole)
    cut: dict[str, str] = {}
    twice: list[str] = []
    differ_parts: list[str] = []
    for part in args.parts:
        for name, sass in kernels(part).items():
            if name in cut:
                twice.append(name)
                if cut[name] != sass:
                    differ_parts.append(name)
            cut[name] = sass
    only_whole, only_cut = sorted(set(whole) - set(cut)), sorted(set(cut) - set(whole))
    differ = sorted({k for k in set(whole) & set(cut) if whole[k] != cut[k]} | set(differ_parts))
    lines = sum(len(s.splitlines()) for s in whole.values())
    print(f"{args.whole}: {len(whole)} kernels, {lines} SASS lines; parts: {len(cut)} kernels")
    print(f"only in the whole unit: {len(only_whole)}; only in the parts: {len(only_cut)}; in two parts: {len(twice)}; "
          f"different SASS: {len(differ)}")
    for name in (only_whole + only_cut + differ)[:10]:
        print(f"  {name}")
    return 0 if not (only_whole or only_cut or differ) else 1


if __name__ == "__main__":
    sys.exit(main())
