"""Rounding to bf16 / f16 / f32 in numpy, bit for bit, in either mode.

Values travel as float64 arrays that hold exactly what the narrow dtype
holds. An engine narrows from fp32, so every rounding here goes through
fp32 first (round to nearest even, as an fp32 unit does), then to the
narrow dtype with the mode asked for:

  "rne"  round to nearest, ties to even (IEEE; torch's .to(), AVX512_BF16)
  "rna"  round to nearest, ties away from zero (a bf16 conversion written
         as "add 0x8000, drop 16 bits")
  "rtz"  toward zero: the bits past the narrow mantissa dropped (vLLM's
         CPU bf16 conversion without AVX512_BF16)

No torch and no ml_dtypes: `make test`'s venv tests the probe with these.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

MODES = ("rne", "rna", "rtz")

# dtype -> (explicit mantissa bits, smallest normal exponent)
FORMATS: Dict[str, Tuple[int, int]] = {"bf16": (7, -126), "f16": (10, -14),
                                       "f32": (23, -126)}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "f16", "half": "f16",
                 "float32": "f32", "float": "f32", "fp32": "f32", "fp16": "f16"}

# Rounding names as attnaudit.v1.Rounding spells them.
ROUNDING_NAMES = {"rne": "nearest_even", "rna": "nearest_even", "rtz": "toward_zero"}


def dtype_name(dtype: str) -> str:
    """The canonical name ("bf16", "f16", "f32") of a dtype name."""
    name = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if name not in FORMATS:
        raise ValueError(f"dtype {dtype!r}: expected bf16, f16 or f32")
    return name


def f32(x: np.ndarray | float) -> np.ndarray:
    """x rounded to fp32 (nearest even), as float64."""
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def narrow(x: np.ndarray | float, dtype: str, mode: str = "rne") -> np.ndarray:
    """x rounded to fp32, then to `dtype` with `mode`; float64 out."""
    dtype = dtype_name(dtype)
    x32 = np.asarray(x, np.float64).astype(np.float32)
    if dtype == "f32":
        return x32.astype(np.float64)
    if mode not in MODES:
        raise ValueError(f"rounding mode {mode!r}: expected one of {MODES}")
    if dtype == "bf16":
        return _bf16(x32, mode)
    return _f16(x32, mode)


def _bf16(x32: np.ndarray, mode: str) -> np.ndarray:
    shape = x32.shape
    u = np.ascontiguousarray(x32).reshape(-1).view(np.uint32).astype(np.uint64)
    if mode == "rtz":
        r = u >> 16
    elif mode == "rna":
        r = (u + 0x8000) >> 16
    else:
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = (r.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out.astype(np.float64).reshape(shape)


def _f16(x32: np.ndarray, mode: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        near = x32.astype(np.float16)              # numpy: nearest even
    x = x32.astype(np.float64)
    r = near.astype(np.float64)
    if mode == "rne":
        return r
    bits = near.view(np.uint16).astype(np.int32)
    if mode == "rtz":
        away = np.abs(r) > np.abs(x)               # nearest went past x
        bits = np.where(away & ((bits & 0x7FFF) != 0), bits - 1, bits)
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    # rna: where nearest-even broke a tie toward zero, step away instead.
    below = np.abs(r) < np.abs(x)
    mid = below & (np.abs(x) - np.abs(r) == 0.5 * spacing(r, "f16"))
    bits = np.where(mid, bits + 1, bits)
    return bits.astype(np.uint16).view(np.float16).astype(np.float64)


def spacing(x: np.ndarray, dtype: str) -> np.ndarray:
    """The distance from |x| to the next larger value of `dtype` (its ulp
    at x; the smallest normal's ulp below that)."""
    mant, emin = FORMATS[dtype_name(dtype)]
    ax = np.abs(np.asarray(x, np.float64))
    ax = np.where((ax > 0) & np.isfinite(ax), ax, 2.0 ** emin)
    e = np.floor(np.log2(ax))
    return np.ldexp(1.0, (np.maximum(e, emin) - mant).astype(np.int64))


def exact(x: np.ndarray | float, dtype: str) -> np.ndarray:
    """x rounded to `dtype` (nearest even): inputs an engine holds exactly."""
    return narrow(x, dtype, "rne")


def is_exact(x: np.ndarray, dtype: str) -> bool:
    """Whether every value of x is representable in `dtype`."""
    a = np.asarray(x, np.float64)
    return bool(np.array_equal(narrow(a, dtype), a))
