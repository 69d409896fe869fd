"""The realistic-scale catalogue: clean families and the bug catalogue.

A family is engine x mode x dtype x declaration; each seed of a family
draws its own shape and statistics (engines/realistic.py: architecture,
batch, keys, page, threads, RoPE table, sink, outliers, peaks), so a
family's seeds cover the shapes users run. Bug cases fix what their bug
needs (an architecture with a soft-cap, sinks or a window; positions at
60k-100k for the long pre-RoPE catalogue) and draw the rest.

  python3 realistic_cases.py [--clean | --bugs | --committed]   lists them
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engines.realistic import RSpec  # noqa: E402

MODES = ("post", "post+rolling", "pre-q", "pre-qk")
DTYPES = ("bf16", "f16", "f32")


def clean_families() -> List[RSpec]:
    """Ordered so that the families sharing a seed's engine pass (same
    engine and dtype) are adjacent (engines/realistic.memo_key)."""
    out: List[RSpec] = []
    for engine in ("vllm-cpu", "hf-eager", "hf-sdpa", "torch-flash-cpu"):
        for dtype in DTYPES:
            for mode in MODES:
                for decl in ("preset", "undeclared") + \
                        (("measured",) if engine == "vllm-cpu" and dtype == "bf16" else ()):
                    out.append(RSpec(engine, dtype, mode, decl))
    # The bf16 narrowing in software, on any CPU: toward zero (declared as
    # the preset, as a probe measures it, and not at all) and to nearest.
    for mode in MODES:
        for decl in ("preset", "measured", "undeclared"):
            out.append(RSpec("vllm-cpu-emu-rtz", "bf16", mode, decl))
    for mode in MODES:
        for decl in ("preset", "undeclared"):
            out.append(RSpec("vllm-cpu-emu-rne", "bf16", mode, decl))
    # fp8 KV (vLLM only; unsupported on CPUs without AVX-512).
    out.append(RSpec("vllm-cpu", "fp8_e4m3", "post", "preset"))
    return out


def long_families() -> List[RSpec]:
    """8k-32k keys per row, batch 4: the long-context terms."""
    out = []
    for mode in ("post", "pre-q"):
        out += [RSpec("vllm-cpu", "bf16", mode, "preset", size="l"),
                RSpec("vllm-cpu", "bf16", mode, "measured", size="l"),
                RSpec("vllm-cpu-emu-rtz", "bf16", mode, "measured", size="l"),
                RSpec("hf-eager", "bf16", mode, "preset", size="l"),
                RSpec("torch-flash-cpu", "bf16", mode, "preset", size="l")]
    return out


def _bug(engine, dtype, mode, bug, variant=None, **kw) -> RSpec:
    return RSpec(engine, dtype, mode, kw.pop("decl", "preset"), kind=kw.pop("kind", "bug"),
                 bug=bug, variant=variant, **kw)


def bug_cases() -> List[RSpec]:
    out: List[RSpec] = []
    V, EA, SD, TF = "vllm-cpu", "hf-eager", "hf-sdpa", "torch-flash-cpu"
    # --- vLLM CPU: the page, length, head, scale faults --------------------
    for bug, variant in (("stale-page", None), ("duplicate-page", None),
                         ("foreign-page", None), ("seq-len-off-by-one", "-1"),
                         ("seq-len-off-by-one", "+1"), ("v-from-k", None),
                         ("kv-heads-permuted", None), ("gqa-mapping", None),
                         ("wrong-scale", "twice")):
        out.append(_bug(V, "bf16", "post", bug, variant))
    # The same faults on the nearest-even path (emu-rne: vLLM's kernels as
    # on an AVX512_BF16 CPU), whose clean families do not false-alarm, so
    # detection there is the error model's, not the truncation's.
    for bug, variant in (("stale-page", None), ("duplicate-page", None),
                         ("foreign-page", None), ("seq-len-off-by-one", "-1"),
                         ("seq-len-off-by-one", "+1"), ("v-from-k", None)):
        out.append(_bug("vllm-cpu-emu-rne", "bf16", "post", bug, variant))
    out += [_bug(V, "bf16", "post", "stale-page", decl="measured"),
            _bug(V, "bf16", "post", "stale-page", decl="undeclared"),
            _bug("vllm-cpu-emu-rtz", "bf16", "post", "stale-page", decl="measured"),
            _bug(V, "f32", "post", "stale-page"), _bug(V, "f32", "post", "gqa-mapping")]
    for arch in ("gemma2-9b", "gemma2-27b"):
        out.append(_bug(V, "bf16", "post", "softcap-missing", arch=arch))
    out.append(_bug(V, "bf16", "post", "wrong-scale", "sqrt-d", arch="gemma2-27b"))
    out += [_bug(V, "bf16", "post", "window-ignored", arch="gemma2-9b", window_layer=True,
                 size="l"),
            _bug(V, "bf16", "post", "sinks-missing", arch="gptoss-20b"),
            _bug(V, "bf16", "post", "window-off-by-one", "+1", arch="gptoss-20b",
                 window_layer=True),
            _bug(V, "bf16", "post", "window-off-by-one", "-1", arch="gptoss-20b",
                 window_layer=True),
            _bug(V, "bf16", "post", "window-ignored", arch="gptoss-20b", window_layer=True)]
    # RoPE bugs: in post+rolling and the pre modes (post cannot see them);
    # the pre modes send the engine's inv_freq.
    rope_plan = {"rope-offset": ("post+rolling", "pre-q", "pre-qk"),
                 "k-rope-twice": ("post+rolling", "pre-qk"),
                 "rope-style": ("post+rolling", "pre-q", "pre-qk"),
                 "rope-theta": ("post+rolling", "pre-q")}
    for bug, modes in rope_plan.items():
        for mode in modes:
            out.append(_bug(V, "bf16", mode, bug, table="inv_freq" if mode != "post+rolling"
                            else "none"))
    for mode in ("post+rolling", "pre-q", "pre-qk"):
        out.append(_bug(V, "bf16", mode, "rope-scaling-ignored", arch="llama3-8b",
                        positions="long",
                        table="inv_freq" if mode != "post+rolling" else "none"))
    for mode in ("post+rolling", "pre-q"):
        out.append(_bug(V, "bf16", mode, "rope-partial-rotary", arch="partial-gptj",
                        table="inv_freq" if mode != "post+rolling" else "none"))
    out += [_bug(V, "bf16", "post", "layout", kind="capture-bug", arch="llama3-8b"),
            _bug(V, "bf16", "post", "layout", kind="capture-bug", arch="gemma2-9b")]

    # --- Hugging Face: the four bugs the issue found PASSing --------------
    for decl in ("preset", "undeclared"):
        for arch in ("gemma2-9b", "gemma2-27b"):
            out.append(_bug(EA, "bf16", "post", "softcap-missing", arch=arch, decl=decl))
        out.append(_bug(EA, "bf16", "post", "wrong-scale", "sqrt-d", arch="gemma2-27b",
                        decl=decl))
        out.append(_bug(EA, "bf16", "post", "sinks-missing", arch="gptoss-20b", decl=decl))
        out.append(_bug(EA, "bf16", "post", "wrong-scale", "sqrt-d", arch="gemma3-27b",
                        decl=decl))
    # ... and the same under f32 and sdpa (where sdpa can run them).
    out += [_bug(EA, "f32", "post", "softcap-missing", arch="gemma2-27b"),
            _bug(EA, "f32", "post", "wrong-scale", "sqrt-d", arch="gemma2-27b"),
            _bug(EA, "f32", "post", "sinks-missing", arch="gptoss-20b"),
            _bug(EA, "f32", "post", "wrong-scale", "sqrt-d", arch="gemma3-27b"),
            _bug(SD, "bf16", "post", "wrong-scale", "sqrt-d", arch="gemma3-27b")]
    # A real behaviour: HF's sdpa drops Gemma2's soft-cap.
    for arch in ("gemma2-9b", "gemma2-27b"):
        out.append(RSpec(SD, "bf16", "post", "preset", kind="engine-behaviour",
                         bug="sdpa-drops-softcap", hypothesis="softcap-missing", arch=arch))
    hf_rope = {"rope-offset": ("post+rolling", "pre-q"),
               "k-rope-twice": ("post+rolling", "pre-qk"),
               "rope-style": ("post+rolling", "pre-q"),
               "rope-theta": ("post+rolling", "pre-q", "pre-qk")}
    for bug, modes in hf_rope.items():
        for mode in modes:
            out.append(_bug(EA, "bf16", mode, bug, table="inv_freq" if mode != "post+rolling"
                            else "none"))
    for mode in ("post+rolling", "pre-q"):
        out.append(_bug(EA, "bf16", mode, "rope-scaling-ignored", arch="llama3-8b",
                        positions="long",
                        table="inv_freq" if mode != "post+rolling" else "none"))
    out.append(_bug(SD, "bf16", "pre-q", "rope-offset", table="inv_freq"))

    # --- torch flash (with its LSE) ----------------------------------------
    for bug, variant in (("lse-base", None), ("v-from-k", None), ("gqa-mapping", None),
                         ("wrong-scale", None), ("stale-page", None), ("duplicate-page", None),
                         ("foreign-page", None), ("seq-len-off-by-one", "-1"),
                         ("seq-len-off-by-one", "+1")):
        out.append(_bug(TF, "bf16", "post", bug, variant))
    out += [_bug(TF, "f32", "post", "stale-page"),
            _bug(TF, "bf16", "post", "stale-page", decl="undeclared"),
            _bug(TF, "bf16", "post+rolling", "rope-offset", table="none"),
            _bug(TF, "bf16", "post+rolling", "k-rope-twice", table="none")]

    # --- pre-RoPE at 60k-100k, with and without the engine's table --------
    for mode in ("pre-q", "pre-qk"):
        for table in ("none", "inv_freq"):
            for bug, variant in (("stale-page", None), ("seq-len-off-by-one", "-1"),
                                 ("v-from-k", None)):
                out.append(_bug(TF, "bf16", mode, bug, variant, positions="long", table=table))
                out.append(_bug(V, "bf16", mode, bug, variant, positions="long", table=table))
                out.append(_bug("vllm-cpu-emu-rne", "bf16", mode, bug, variant,
                                positions="long", table=table))
            out.append(_bug(TF, "bf16", mode, "bf16-running-output", positions="long",
                            table=table, hypothesis="low-precision"))
    return out


def committed_cases() -> List[RSpec]:
    """The small realistic subset `make test` replays (size "s": the
    architectures' head dim and group size over 1-2 KV heads (4 heads for
    MHA), batch 4, 256-1.1k keys). See generate_realistic.py."""
    out = [RSpec("vllm-cpu", "bf16", "post", "preset", size="s", arch="llama3-8b", threads=4),
           RSpec("vllm-cpu", "bf16", "post", "measured", size="s", arch="llama3-8b", threads=4),
           RSpec("vllm-cpu", "bf16", "pre-q", "undeclared", size="s", arch="qwen2-7b",
                 threads=1, table="none"),
           RSpec("vllm-cpu-emu-rtz", "bf16", "post", "measured", size="s", arch="qwen3-8b",
                 threads=8),
           RSpec("vllm-cpu-emu-rtz", "bf16", "pre-qk", "measured", size="s", arch="llama3-8b",
                 threads=4, table="inv_freq"),
           RSpec("vllm-cpu-emu-rne", "bf16", "post+rolling", "preset", size="s",
                 arch="gptoss-20b", threads=4),
           RSpec("vllm-cpu", "f32", "post", "preset", size="s", arch="gemma2-27b", threads=4),
           RSpec("hf-eager", "bf16", "post", "preset", size="s", arch="gemma2-27b"),
           RSpec("hf-eager", "bf16", "pre-q", "undeclared", size="s", arch="llama3-8b",
                 table="inv_freq"),
           RSpec("hf-sdpa", "bf16", "post", "preset", size="s", arch="qwen3-8b"),
           RSpec("torch-flash-cpu", "bf16", "post", "preset", size="s", arch="mha-7b"),
           RSpec("torch-flash-cpu", "f16", "post+rolling", "undeclared", size="s",
                 arch="llama3-8b")]
    out += [_bug("vllm-cpu-emu-rtz", "bf16", "post", "stale-page", decl="measured", size="s",
                 arch="llama3-8b", threads=4),
            _bug("hf-eager", "bf16", "post", "softcap-missing", size="s", arch="gemma2-27b"),
            _bug("hf-eager", "bf16", "post", "sinks-missing", size="s", arch="gptoss-20b"),
            _bug("torch-flash-cpu", "bf16", "post", "stale-page", size="s", arch="llama3-8b")]
    return out


def all_realistic(sets=("clean", "bugs")) -> List[RSpec]:
    out: List[RSpec] = []
    if "clean" in sets:
        out += clean_families()
    if "long" in sets:
        out += long_families()
    if "bugs" in sets:
        out += bug_cases()
    if "committed" in sets:
        out += committed_cases()
    names = [s.name for s in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise AssertionError(f"duplicate realistic case names: {sorted(dupes)}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="clean,long,bugs")
    args = ap.parse_args()
    cases = all_realistic(tuple(args.set.split(",")))
    for c in cases:
        print(f"{c.name:90s} {c.kind:16s} {c.expected_hypothesis or ''}")
    print(f"{len(cases)} cases", file=sys.stderr)
