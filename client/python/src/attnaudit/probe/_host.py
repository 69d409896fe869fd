"""What the evidence says about the host: the CPU model, the ISA flags that
decide an engine's arithmetic, library versions (read from the installed
distributions' metadata, without importing them)."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Dict, List, Optional, Sequence, Set

# The x86 flags that change a CPU engine's 16-bit arithmetic (vLLM's CPU
# kernels pick their build by avx512f / avx512_bf16 and convert to bf16 by
# truncation without AVX512_BF16), and Arm's equivalents.
X86_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")
ARM_FLAGS = ("asimd", "bf16", "fphp", "sve")


def cpuinfo(path: str = "/proc/cpuinfo") -> Dict[str, object]:
    """{"model": str, "flags": set of str} of the first processor listed
    (empty when the file cannot be read: not Linux)."""
    model = ""
    flags: Set[str] = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model", "hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(), "flags": flags}


def isa_summary(flags: Sequence[str] | set) -> str:
    """"avx2, fma, f16c; no avx512f, no avx512_bf16, no amx_bf16"."""
    names = ARM_FLAGS if "asimd" in flags else X86_FLAGS
    have = [f for f in names if f in flags]
    lack = [f"no {f}" for f in names if f not in flags]
    return ", ".join(have) + ("; " + ", ".join(lack) if lack else "")


def has_avx512_bf16(info: Optional[Dict[str, object]] = None) -> Optional[bool]:
    """Whether the CPU converts fp32 to bf16 in hardware (x86 avx512_bf16 or
    amx_bf16); None when not an x86 Linux host (unknown)."""
    info = info or cpuinfo()
    flags = info.get("flags") or set()
    if not flags or "asimd" in flags:  # type: ignore[operator]
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags  # type: ignore[operator]


def versions(packages: Sequence[str]) -> List[str]:
    """"name version" of each installed distribution among `packages` (the
    first installed name of each "a|b" alternative)."""
    out = []
    for spec in packages:
        for name in spec.split("|"):
            try:
                out.append(f"{name.split('-')[0] if name.startswith('vllm') else name} "
                           f"{importlib.metadata.version(name)}")
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def host(packages: Sequence[str] = ()) -> Dict[str, object]:
    """The host's description for the evidence."""
    info = cpuinfo()
    flags = info["flags"]
    return {"cpu": info["model"], "isa": isa_summary(flags),  # type: ignore[arg-type]
            "avx512_bf16": has_avx512_bf16(info), "machine": platform.machine(),
            "python": platform.python_version(), "versions": versions(packages)}
