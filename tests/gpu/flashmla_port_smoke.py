"""Runs a trimmed smoke set of FlashMLA's own dense decode test against kforge's sm_120 port.

Not a pytest module: it runs on the GPU host next to a FlashMLA build, as
    python tests/gpu/flashmla_port_smoke.py --flashmla-tree /path/to/FlashMLA [--dtype bf16 fp16]
It imports upstream's tests/test_flash_mla_dense_decoding.py (its data generator, torch reference and
tolerances: out abs 8e-4 / rel 2.01/128 / cos 5e-6, lse abs 1e-6 / rel 8.01/65536) and runs its
`test_flash_mla` on the cases below with FLASH_MLA_FORCE_PORT=1, checking that the port really ran.
Exit code 0 only if every case passed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

# (h_q, h_kv) pairs: upstream's h_q {1,3,9,63,64,126,128} x h_kv {1,2,3,8} trimmed, plus the 16/32
# heads the benchmark uses (one 16-row CTA and one 32-row CTA per KV head).
HEAD_PAIRS = [(1, 1), (3, 3), (9, 1), (16, 1), (32, 1), (63, 1), (64, 1), (128, 1), (126, 2), (64, 2), (9, 3), (128, 8)]


def smoke_cases(mod):
    cases = []
    for b, s_q, s_k, (h_q, h_kv), varlen, causal in itertools.product(
        [1, 64], [1, 2, 4], [20, 140, 4096], HEAD_PAIRS, [False, True], [False, True]
    ):
        if s_q == 4 and b == 64:
            continue  # keep the set small: s_q=4 runs at b=1
        cases.append(mod.TestParam(b, s_q, s_k, varlen, causal, test_performance=False,
                                   have_zero_seqlen_k=False, block_size=64, h_q=h_q, h_kv=h_kv))
    # upstream's corner cases: some requests with seqlen_k == 0
    for (h_q, h_kv), causal in itertools.product([(16, 1), (64, 1), (128, 1), (126, 2)], [False, True]):
        cases.append(mod.TestParam(128, 2, 4096, is_varlen=True, is_causal=causal, test_performance=False,
                                   have_zero_seqlen_k=True, h_q=h_q, h_kv=h_kv))
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flashmla-tree", required=True, help="FlashMLA source tree (for tests/)")
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp16"], choices=["bf16", "fp16"])
    parser.add_argument("--impl", default="port", choices=["port", "sm90"],
                        help="port: FLASH_MLA_FORCE_PORT=1; sm90: upstream's wgmma kernel (control run)")
    parser.add_argument("--block-m", choices=["16", "32", "32w8", "64"],
                        help="force the port's q rows per CTA (FLASH_MLA_PORT_BLOCK_M; 32w8: 32 rows on the 8-warp "
                             "kernel); default: its own choice")
    args = parser.parse_args(argv)
    if args.block_m:
        os.environ["FLASH_MLA_PORT_BLOCK_M"] = args.block_m

    import torch

    tests_dir = os.path.join(args.flashmla_tree, "tests")
    sys.path.insert(0, tests_dir)
    import flash_mla  # noqa: E402  (the installed build)
    import test_flash_mla_dense_decoding as mod  # noqa: E402
    from flash_mla.flash_mla_interface import get_dense_decode_impl  # noqa: E402

    if args.impl == "port":
        os.environ["FLASH_MLA_FORCE_PORT"] = "1"
        want = "sm120_mma_port"
    else:
        os.environ.pop("FLASH_MLA_FORCE_PORT", None)
        want = "sm90_wgmma"
    got = get_dense_decode_impl()
    print(f"device: {torch.cuda.get_device_name()}  flash_mla: {flash_mla.__file__}  impl: {got}")
    if got != want:
        print(f"FAIL: expected dense decode impl {want}, the build reports {got}")
        return 1

    failures = 0
    total = 0
    for dtype_name in args.dtype:
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
        torch.set_default_dtype(dtype)
        torch.set_default_device("cuda:0")
        cases = smoke_cases(mod)
        t0 = time.time()
        for case in cases:
            total += 1
            try:
                mod.test_flash_mla(case)
            except AssertionError as exc:
                failures += 1
                print(f"FAILED {dtype_name} {case}: {exc}")
        print(f"== {dtype_name}: {len(cases)} cases, {time.time() - t0:.1f} s")
    print(f"SMOKE RESULT impl={got} block_m={args.block_m or 'auto'}: {total - failures}/{total} passed")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
