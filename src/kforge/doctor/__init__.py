"""The wheel doctor: prove what is inside a wheel before it is published.

For every ELF ``.so`` and PE ``.pyd``/``.dll`` in a wheel it reports the SASS archs and PTX
versions in the CUDA fatbins (with ``a``/``f`` variants and compression), the undefined
symbols (an unresolved ``__cudaRegisterLinkedBinary_*`` means device code was never
linked), the NEEDED libraries, and the size by section. :func:`verify` fails a wheel that
lacks an expected arch, naming the arch and the binary: the "no kernel image is
available" bug, caught before shipping.

>>> report = inspect_wheel("dist/kforge_fmha-0.1.0-cp312-cp312-linux_x86_64.whl")  # doctest: +SKIP
>>> verify(report, ["sm_90a"], default_policy("fmha"))  # doctest: +SKIP
"""

from __future__ import annotations

from kforge.doctor.checks import check, verify
from kforge.doctor.fatbin import FatbinFormatError, parse_fatbins
from kforge.doctor.model import (
    BinaryReport,
    FatbinEntry,
    Finding,
    SectionSize,
    WheelReport,
)
from kforge.doctor.render import render_text, to_dict, to_json
from kforge.doctor.wheel import (
    inspect_binary,
    inspect_bytes,
    inspect_wheel,
    inspect_wheels,
)

__all__ = [
    "BinaryReport",
    "FatbinEntry",
    "FatbinFormatError",
    "Finding",
    "SectionSize",
    "WheelReport",
    "check",
    "inspect_binary",
    "inspect_bytes",
    "inspect_wheel",
    "inspect_wheels",
    "parse_fatbins",
    "render_text",
    "to_dict",
    "to_json",
    "verify",
]
