"""What every engine driver shares: the case spec, the capture, the modes,
a shuffled page pool, and the bug helpers that do not depend on an engine.

Vocabulary (tests/conformance/README.md has the whole picture):

mode        what the snapshot carries about RoPE
  post          q and K post-RoPE, as the engine attended with them
  post+rolling  post, plus this step's q and new key before RoPE
                (pre_rope_q, pre_rope_k): attnaudit's rolling RoPE check
  pre-q         q before RoPE (attnaudit rotates it), K post-RoPE
  pre-qk        q and every cached key before RoPE (the pool holds
                pre-RoPE keys)
kind        clean | bug | engine-behaviour | capture-bug
bug         the injected fault, named as attnaudit's diagnosis names it

A snapshot always declares the model's TRUE configuration (RoPE, scale,
soft-cap, window, sinks, fp8 scales) and holds what a correct capture
hook would send: for an engine-side bug the engine computed with the bug,
for a capture bug the engine is right and the capture is wrong.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

MODES = ("post", "post+rolling", "pre-q", "pre-qk")
KINDS = ("clean", "bug", "engine-behaviour", "capture-bug")


@dataclass(frozen=True)
class CaseSpec:
    """One conformance case: which engine runs what, and what to inject."""

    name: str                     # fixture name, unique
    engine: str                   # engine preset: vllm-cpu, hf-eager, hf-sdpa, torch-flash-cpu
    model: str                    # the engine module's model variant
    dtype: str                    # bf16, f16, f32, fp8_e4m3, fp8_e5m2 (KV; model bf16)
    mode: str = "post"            # one of MODES
    kind: str = "clean"           # one of KINDS
    bug: Optional[str] = None     # injected fault (diagnosis hypothesis name)
    variant: Optional[str] = None  # which form of the bug ("+1", "swapped", ...)
    hypothesis: Optional[str] = None  # expected top diagnosis (default: bug)
    rope_table: Optional[str] = None  # None, "rows" (cos/sin rows) or "inv_freq"
    offset: Optional[int] = None  # first position of every row (None: model default)
    layer: int = 0                # HF: which decoder layer's attention call
    seed: int = 0
    note: str = ""

    @property
    def expected_hypothesis(self) -> Optional[str]:
        """The top diagnosis the truth calls for: none for a clean run; the
        bug's name for an injected bug (unless `hypothesis` says
        otherwise); for an engine behaviour only what `hypothesis` names
        (None: no catalogue hypothesis fits, only DRIFT is expected)."""
        if self.kind == "clean":
            return None
        if self.kind == "engine-behaviour":
            return self.hypothesis
        return self.hypothesis or self.bug

    def replace(self, **kw) -> "CaseSpec":
        return dataclasses.replace(self, **kw)


@dataclass
class Capture:
    """What an engine run produced: the keyword arguments of
    Snapshot.from_paged_kv, the truth about the injected bug's place
    (row, logical_block, page: engine page id), and notes."""

    args: Dict[str, Any]
    location: Optional[Dict[str, int]] = None
    info: Dict[str, Any] = field(default_factory=dict)

    def snapshot(self):
        from attnaudit import Snapshot
        return Snapshot.from_paged_kv(**self.args)


class Unsupported(Exception):
    """The engine cannot run this case (recorded, not a failure)."""


# ----------------------------------------------------------------------
# dtypes, seeds
# ----------------------------------------------------------------------


def torch_dtype(name: str):
    """The torch dtype of a case dtype name (fp8 KV cases run in bf16)."""
    import torch
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "fp8_e4m3": torch.bfloat16, "fp8_e5m2": torch.bfloat16}[name]


def generator(spec: CaseSpec, salt: int = 0):
    """A torch.Generator seeded from the case (its name, seed and salt), so
    that every case is reproducible on its own and cases differ."""
    import torch
    import zlib
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"{spec.name}/{spec.seed}/{salt}".encode()) & 0x7FFFFFFF)
    return g


def base_generator(spec: CaseSpec, salt: int = 0):
    """A generator that depends on the model, dtype and seed only, not on the
    mode or bug: a bug case sees the same data as its clean twin."""
    import torch
    import zlib
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"{spec.engine}/{spec.model}/{spec.dtype}/{spec.seed}/{salt}"
                             .encode()) & 0x7FFFFFFF)
    return g


# ----------------------------------------------------------------------
# RoPE declarations
# ----------------------------------------------------------------------


def rope_states(mode: str) -> Tuple[str, str]:
    """(q_state, k_state) of a mode."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    return ("pre" if mode in ("pre-q", "pre-qk") else "post",
            "pre" if mode == "pre-qk" else "post")


def rope_declaration(true_rope: Dict[str, Any], mode: str,
                     **extra) -> Dict[str, Any]:
    """The snapshot's rope dict: the model's true config plus the mode's
    q/k states (and extra keys such as k_output_dtype)."""
    q_state, k_state = rope_states(mode)
    out = dict(true_rope)
    out.update(q_state=q_state, k_state=k_state, **extra)
    return out


# ----------------------------------------------------------------------
# A shuffled page pool (for engines that do not page their cache)
# ----------------------------------------------------------------------


@dataclass
class PagedRows:
    """Per-row K/V scattered into a pool of pages with shuffled ids, the
    pool larger than needed and its unused slots full of stale values.

    k_pool, v_pool: [N, P, Hkv, D] ("nhd") or [N, Hkv, P, D] ("hnd");
    block_table: int32 [B, max_blocks] (-1 past a row's blocks);
    seq_lens: int32 [B]."""

    k_pool: Any
    v_pool: Any
    block_table: Any
    seq_lens: Any
    page_size: int
    layout: str

    def page_of(self, row: int, block: int) -> int:
        return int(self.block_table[row, block])

    def gather(self, pool, row: int, block_table=None, seq_len: Optional[int] = None):
        """Row `row`'s tokens [T, Hkv, D] read through a block table (the
        engine's, possibly faulty), as an engine's gather would."""
        import torch
        table = self.block_table if block_table is None else block_table
        L = int(self.seq_lens[row]) if seq_len is None else int(seq_len)
        P = self.page_size
        blocks = []
        for j in range((L + P - 1) // P):
            page = pool[int(table[row, j])]
            blocks.append(page if self.layout == "nhd" else page.transpose(0, 1))
        return torch.cat(blocks, 0)[:L]


def page_rows(rows_k: Sequence[Any], rows_v: Sequence[Any], page_size: int,
              layout: str, g, extra_pages: int = 3,
              fill_scale: float = 1.0) -> PagedRows:
    """Scatters rows_k[b], rows_v[b] ([T_b, Hkv, D] torch tensors, one dtype)
    into a shuffled pool (see PagedRows)."""
    import torch
    if layout not in ("nhd", "hnd"):
        raise ValueError(f"layout {layout!r}")
    B = len(rows_k)
    P = page_size
    Hkv, D = int(rows_k[0].shape[1]), int(rows_k[0].shape[2])
    dtype = rows_k[0].dtype
    lens = [int(k.shape[0]) for k in rows_k]
    nblocks = [(L + P - 1) // P for L in lens]
    N = sum(nblocks) + extra_pages
    shape = (N, P, Hkv, D) if layout == "nhd" else (N, Hkv, P, D)
    # Stale content of earlier requests in every slot.
    k_pool = (torch.randn(shape, generator=g) * fill_scale).to(dtype)
    v_pool = (torch.randn(shape, generator=g) * fill_scale).to(dtype)
    ids = torch.randperm(N, generator=g)
    table = torch.full((B, max(nblocks) + 1), -1, dtype=torch.int32)
    used = 0
    for b in range(B):
        for j in range(nblocks[b]):
            page = int(ids[used])
            used += 1
            table[b, j] = page
            lo, hi = j * P, min(lens[b], (j + 1) * P)
            for pool, src in ((k_pool, rows_k[b]), (v_pool, rows_v[b])):
                chunk = src[lo:hi]
                if layout == "nhd":
                    pool[page, : hi - lo] = chunk
                else:
                    pool[page, :, : hi - lo] = chunk.transpose(0, 1)
    # Engines leave stale ids past a row's blocks: so do we.
    for b in range(B):
        table[b, nblocks[b]:] = int(ids[-1])
    return PagedRows(k_pool, v_pool, table, torch.tensor(lens, dtype=torch.int32),
                     P, layout)


# ----------------------------------------------------------------------
# Bug helpers shared by the engines
# ----------------------------------------------------------------------


def gqa_mod_order(Hq: int, Hkv: int) -> List[int]:
    """The query-head order that makes a kernel with the right GQA mapping
    (head i reads KV head i // group) compute the wrong one (head h reads
    KV head h % Hkv): feed q[:, order] and put the kernel's output i back at
    head order[i]."""
    group = Hq // Hkv
    order = sorted(range(Hq), key=lambda h: (h % Hkv, h))
    assert all(order[i] % Hkv == i // group for i in range(Hq))
    return order


def moved_heads(Hq: int, Hkv: int) -> List[int]:
    """The query heads whose KV head differs between h // group and h % Hkv."""
    group = Hq // Hkv
    return [h for h in range(Hq) if h // group != h % Hkv]


def unique_positions(*arrays) -> Any:
    """Sorted distinct positions of several integer tensors (int64)."""
    import torch
    return torch.unique(torch.cat([a.reshape(-1).to(torch.int64) for a in arrays]))
