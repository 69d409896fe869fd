#!/usr/bin/env python3
"""Independent oracle for the RL-Kernel compatible prefix fingerprint.

Builds, with hashlib and struct only (no torch, no attnaudit code), the byte
stream the RL-Kernel decode harness hashes in `_decode_cache_fingerprint`
(domain "shared_prefix"; docs/FINGERPRINTS.md, "RL-Kernel compatible prefix
stream") for its acceptance fixture (docs/RL_KERNEL_HARNESS.md), in the
harness's own per-row logical terms:

  B=2 rows, Hkv=2, D=8, page_size=2, 6 cached tokens per row (3 pages),
  CP block owners [0, 1, 0], prefix key 'shared-prefix', theta 1e6,
  K[b][h][t][d] = 0.25 * i and V[b][h][t][d] = 1 - 0.125 * i with
  i = ((b * Hkv + h) * 6 + t) * D + d (exact in fp32 and bf16).

Usage:
  rlkernel_fingerprint_oracle.py             print "<variant> <sha256>" lines
  rlkernel_fingerprint_oracle.py --check F   exit 1 unless every variant's
                                             digest equals the constant of the
                                             same name in the C++ test file F
"""

import hashlib
import math
import re
import struct
import sys

B, HKV, D, P, L = 2, 2, 8, 2, 6
OWNERS = [0, 1, 0]


def element_index(b, h, t, d):
    return ((b * HKV + h) * L + t) * D + d


def k_value(b, h, t, d):
    return 0.25 * element_index(b, h, t, d)


def v_value(b, h, t, d):
    return 1.0 - 0.125 * element_index(b, h, t, d)


def float_bytes(value, dtype):
    raw = struct.pack("<f", value)
    if dtype == "torch.float32":
        return raw
    if dtype == "torch.bfloat16":
        # The fixture's values are exact in bf16: the top half of the f32.
        assert raw[:2] == b"\x00\x00", value
        return raw[2:]
    raise ValueError(dtype)


def int_bytes(values, dtype):
    fmt = {"torch.int64": "q", "torch.int32": "i"}[dtype]
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def harness_digest(*, prefix_length, key, theta, k_rope_state, kv_dtype,
                   pos_dtype, positions):
    """The harness's stream: header line, then per row a line and four
    tensors, each as str(tuple(shape)), str(dtype), raw little-endian bytes."""
    sha = hashlib.sha256()
    sha.update(
        (f"domain=shared_prefix;page_size={P};prefix_cache_enabled={True};"
         f"prefix_cache_key={key!r};prefix_length={prefix_length};"
         f"k_rope_state={k_rope_state};rope_theta={float(theta):.17g};"
         f"rotary_dim={D};rope_cast_at=after_rope;"
         f"k_rope_output_dtype={kv_dtype};k_dtype={kv_dtype};"
         f"v_dtype={kv_dtype}\n").encode())
    n = prefix_length
    for b in range(B):
        owners = OWNERS[:math.ceil(n / P)]
        sha.update(f"batch={b};tokens={n};owners={owners}\n".encode())
        for _ in range(2):  # global_token_positions, then key_position_ids
            sha.update(str((n,)).encode())
            sha.update(pos_dtype.encode())
            sha.update(int_bytes(positions[:n], pos_dtype))
        for value in (k_value, v_value):
            sha.update(str((HKV, n, D)).encode())
            sha.update(kv_dtype.encode())
            sha.update(b"".join(
                float_bytes(value(b, h, t, d), kv_dtype)
                for h in range(HKV) for t in range(n) for d in range(D)))
    return sha.hexdigest()


# Variant name -> (C++ constant name, harness arguments).
VARIANTS = {
    "base": ("kRlKernelOracleBase", dict(
        prefix_length=4, key="shared-prefix", theta=1_000_000.0,
        k_rope_state="post_rope", kv_dtype="torch.float32",
        pos_dtype="torch.int64", positions=list(range(L)))),
    "int32_positions": ("kRlKernelOracleInt32Positions", dict(
        prefix_length=4, key="shared-prefix", theta=1_000_000.0,
        k_rope_state="post_rope", kv_dtype="torch.float32",
        pos_dtype="torch.int32", positions=list(range(L)))),
    # bf16 cache, pre-RoPE K, gapped positions from an offset, a prefix
    # ending inside a page, another key and theta.
    "bf16_pre_rope": ("kRlKernelOracleBf16PreRope", dict(
        prefix_length=3, key="p-42", theta=10_000.0,
        k_rope_state="pre_rope", kv_dtype="torch.bfloat16",
        pos_dtype="torch.int64", positions=[100 + 3 * t for t in range(L)])),
}


def main(argv):
    digests = {name: harness_digest(**args)
               for name, (_, args) in VARIANTS.items()}
    if len(argv) == 3 and argv[1] == "--check":
        with open(argv[2], encoding="utf-8") as f:
            source = f.read()
        failed = False
        for name, (constant, _) in VARIANTS.items():
            match = re.search(constant + r'\[\]\s*=\s*"([0-9a-f]{64})"', source)
            if match is None:
                print(f"{name}: constant {constant} not found in {argv[2]}")
                failed = True
            elif match.group(1) != digests[name]:
                print(f"{name}: test has {match.group(1)}, oracle {digests[name]}")
                failed = True
            else:
                print(f"{name}: {digests[name]} OK")
        return 1 if failed else 0
    if len(argv) != 1:
        print(__doc__)
        return 2
    for name, digest in digests.items():
        print(name, digest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
