"""Snapshot: one attention call of one layer at one decode step, ready to send.

A Snapshot holds the non-tensor fields of an attnaudit.v1.Snapshot as a
protobuf message and every tensor as an owned byte buffer (WireTensor). It is
built from an engine's tensors with Snapshot.from_paged_kv (paged KV caches
in the vLLM / FlashInfer / plain-pool layouts), from arrays already in wire
layout with Snapshot.from_arrays, or read with Snapshot.load / from_proto.

Copies: every byte a snapshot needs is copied once, when it is built (the
page gather for the KV cache, one copy of each small tensor), so the caller
may overwrite its tensors as soon as the builder returns. Encoding for the
wire or a file joins memoryviews of those buffers without re-copying them
into protobuf objects. CUDA tensors are gathered on the current stream and
copied to pinned host memory asynchronously; the snapshot waits for that
copy only when it is encoded (wait()), which the RolloutAuditor does on its
background thread. Floating arrays keep their dtype: f64 stays f64.

Errors: a builder argument that cannot form a snapshot raises ValueError or
TypeError naming the argument (e.g. "engine_lse: shape (32, 8) ..."). The
server's validation (docs/NUMERICS.md) is the authority on everything else
and answers InvalidArgumentError with the field path.

Thread safety: building is not thread-safe for one Snapshot; a built
Snapshot may be encoded from any thread.
"""

from __future__ import annotations

import inspect
import math
import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from attnaudit.v1 import snapshot_pb2

from . import _arrays as A
from . import _enums as E
from . import _wire
from ._presets import ENGINE_PRESETS, HF_DEFAULT_CAST_POINT, HF_FAMILY_CAST_POINTS
from .fingerprint import prefix_fingerprint

_LAYOUTS_FUSED = {"vllm": (0, False), "flash_attn": (0, False),
                  "flashinfer_nhd": (1, False), "flashinfer_hnd": (1, True)}
_LAYOUTS_SPLIT = {"vllm": False, "flash_attn": False, "flashinfer_nhd": False,
                  "nhd": False, "flashinfer_hnd": True, "hnd": True}
# vLLM's CPU attention backend: one [num_blocks, Hkv, 2 * block_size, D]
# tensor per layer; per (block, KV head) the K block is stored transposed,
# [D, block_size] row-major, then V as [block_size, D].
_LAYOUT_VLLM_CPU = "vllm_cpu"

class Snapshot:
    """A decode-attention snapshot (see the module docstring)."""

    def __init__(self, meta: snapshot_pb2.Snapshot,
                 tensors: Dict[str, A.WireTensor], *, gathered_event: Any = None,
                 auto_prefix_fingerprint: bool = False):
        # Not meant to be called directly: use the from_* builders or load.
        self._meta = meta
        self._tensors = tensors
        self.gathered_event = gathered_event
        self._auto_prefix = auto_prefix_fingerprint

    # ------------------------------------------------------------------
    # Builders
    # ------------------------------------------------------------------

    @classmethod
    def from_paged_kv(cls, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *,
                      layout: str = "vllm", query_positions: Any = None,
                      key_positions: Any = None, **options: Any) -> "Snapshot":
        """Builds a snapshot from an engine's paged KV cache.

        q: [B, Hq, D] (decode) or [B, Sq, Hq, D] queries (post-RoPE unless
          rope says otherwise).
        k_cache, v_cache: the layer's cache. With v_cache=None, k_cache is
          the fused K/V tensor of `layout`:
            "vllm" (alias "flash_attn"): [2, num_blocks, block_size, Hkv, D]
            "flashinfer_nhd":           [num_blocks, 2, block_size, Hkv, D]
            "flashinfer_hnd":           [num_blocks, 2, Hkv, block_size, D]
          With separate K and V tensors, each is [num_blocks, block_size,
          Hkv, D] ("vllm", "flashinfer_nhd", "nhd": a plain page pool) or
          [num_blocks, Hkv, block_size, D] ("flashinfer_hnd", "hnd").
          "vllm_cpu" (vLLM's CPU backend): the fused
          [num_blocks, Hkv, 2 * block_size, D] tensor, K stored transposed
          per block and head, or its key_cache/value_cache halves.
          Strided views (e.g. vLLM's HND stride order) are fine.
        block_table: [B, max_blocks] engine page ids; entries past a row's
          ceil(seq_lens[b] / block_size) blocks are ignored (engines leave
          stale ids there).
        seq_lens: [B] tokens in the cache each row's attention read,
          including this step's.
        query_positions: [B, Sq] (or [B]) global positions of the queries;
          default: the last Sq tokens of each row.
        key_positions: [B, T] (T >= max seq_len) global position of each
          row's logical token; default: 0, 1, 2, ... Needed when positions
          start at an offset or have gaps.

        Only the pages the block table references are sent, in ascending
        engine page id order; page_ids keeps the engine's ids and the
        block_table sent holds engine ids, so reports name the engine's
        pages. Keyword options: see Snapshot.from_arrays.

        block_table, seq_lens and the positions are read on the host: pass
        the engine's host copies (a CUDA tensor here is read synchronously).
        """
        plan = A.CopyPlan()
        q4 = _as_bsq(A.as_array(q, "q"), "q", 2)
        B, Sq, Hq, D = (int(d) for d in q4.shape)
        kp, vp, hnd = _pool_views(k_cache, v_cache, layout, D)
        P = int(kp.shape[2] if hnd else kp.shape[1])
        if int(kp.shape[3]) != D:
            raise ValueError(f"k_cache: head dim {int(kp.shape[3])} differs from "
                             f"q's head dim {D} (layout {layout!r}, pages "
                             f"{tuple(kp.shape)})")
        lens = _int_vector(seq_lens, "seq_lens", B)
        table = A.host_numpy(block_table, "block_table")
        if table.ndim != 2 or table.shape[0] != B:
            raise ValueError(f"block_table: shape {tuple(table.shape)} must be "
                             f"[B={B}, max_blocks]")
        table = table.astype(np.int64, copy=False)
        paging = _Paging(table, lens, P, int(kp.shape[0]),
                         _key_positions(key_positions, B, lens))
        qpos = _query_positions(query_positions, paging, B, Sq)

        tensors = {
            "q": plan.own(q4, "q"),
            "k_pages": plan.take_pages(kp, paging.page_ids, "k_cache"),
            "v_pages": plan.take_pages(vp, paging.page_ids, "v_cache"),
            "page_ids": A.int_tensor(paging.page_ids),
            "block_table": A.int_tensor(paging.block_table),
            "kv_seq_lens": A.int_tensor(lens),
            "query_positions": A.int_tensor(qpos),
            "slot_positions": A.int_tensor(paging.slot_positions),
        }
        meta = snapshot_pb2.Snapshot(
            kv_layout=snapshot_pb2.KV_LAYOUT_HND if hnd else snapshot_pb2.KV_LAYOUT_NHD)
        auto = _apply_options(meta, tensors, plan, (B, Sq, Hq, D),
                              max_blocks=paging.block_table.shape[1], **options)
        plan.finish()
        return cls(meta, tensors, gathered_event=plan.gathered_event,
                   auto_prefix_fingerprint=auto)

    @classmethod
    def from_arrays(cls, *, q: Any, k_pages: Any, v_pages: Any, block_table: Any, kv_seq_lens: Any,
                    query_positions: Any, slot_positions: Any, kv_layout: Any = "nhd",
                    page_ids: Any = None, key_rope_positions: Any = None,
                    softmax_scale: Optional[float] = None, sliding_window: Optional[int] = None,
                    window_convention: Any = None, logit_softcap: Optional[float] = None,
                    sinks: Any = None, engine_lse_includes_sinks: bool = False, rope: Any = None,
                    output_dtype: Any = None, k_scale: Any = None, v_scale: Any = None,
                    cp_world_size: Optional[int] = None, cp_sharding: Any = None,
                    cp_interleave_size: Optional[int] = None, cp_block_owners: Any = None,
                    cp_rank_out: Any = None, cp_rank_lse: Any = None, engine_out: Any = None,
                    engine_lse: Any = None, lse_base: Any = None, engine_logprobs: Any = None,
                    selected_token_ids: Any = None, lm_head: Any = None, active_mask: Any = None,
                    logprob_temperature: Optional[float] = None, prefix_key: Optional[str] = None,
                    prefix_length: Optional[int] = None, prefix_fingerprint: Optional[str] = None,
                    prefix_scheme: Any = None, labels: Any = None, engine: Any = None,
                    precision: Any = None, rope_table: Any = None, pre_rope_q: Any = None,
                    pre_rope_k: Any = None) -> "Snapshot":
        """Builds a snapshot from arrays already in wire layout (each copied
        once). The keyword options, shared with from_paged_kv:

        softmax_scale (default 1/sqrt(D)), sliding_window (tokens; default
        none), window_convention ("hf": W keys, "flash_left": W + 1),
        logit_softcap, sinks ([Hq] natural-log logits), and
        engine_lse_includes_sinks: the attention variant.
        rope: None (q and K post-RoPE, the engines' usual case) or a dict /
        attnaudit.v1.RopeConfig: theta (or rope_theta), style ("neox",
        "gptj"), q_state / k_state ("post", "pre"), rotary_dim, scaling (a
        dict in attnaudit or Hugging Face terms: type or rope_type, factor,
        low_freq_factor, high_freq_factor, original_max_position(_embeddings),
        beta_fast, beta_slow, attention_factor, truncate; dynamic and
        longrope also sequence_length, the length the engine scaled for,
        max_position_embeddings, max_trained_positions, short_factor,
        long_factor, short_mscale, long_mscale: docs/PYTHON.md),
        q_output_dtype, k_output_dtype.
        output_dtype: dtype of the attention output (default: engine_out's).
        k_scale, v_scale: fp8 dequantisation scales, a float or [Hkv].
        cp_world_size, cp_sharding ("none", "explicit_owners",
        "token_interleaved", "page_interleaved"), cp_interleave_size,
        cp_block_owners [B, M], cp_rank_out [W, B, (Sq,) Hq, D] and
        cp_rank_lse [W, B, (Sq,) Hq]: context parallelism.
        engine_out [B, (Sq,) Hq, D] (or [B, Hq*D]), engine_lse [B, (Sq,) Hq]
        and lse_base ("e" or "2"; required whenever engine_lse or
        cp_rank_lse is given), engine_logprobs [B, (Sq)]: the engine's
        results.
        selected_token_ids [B, (Sq)], lm_head [V, Hq*D], active_mask
        [B, (Sq)], logprob_temperature: selected-token log-probs.
        prefix_key, prefix_length, prefix_fingerprint (64 hex, or "auto" to
        compute attnaudit's v1 digest here), prefix_scheme
        ("attnaudit_v1", "rl_kernel_compat"): prefix-cache identity.
        labels: a dict (model, layer, engine, backend, step, run,
        request_ids, role, weight_version) or an attnaudit.v1.Labels; run
        names the rollout or training run (list_results filters on it);
        role ("rollout" or "trainer") with run, layer and request_ids makes
        the snapshot one side of a train-rollout pair the server joins
        (make_labels).
        engine: a name of ENGINE_PRESETS ("vllm-cpu", "hf-eager", "hf-sdpa",
        "torch-flash-cpu", "vllm", "flash-decoding"): declares the engine's
        precision profile and its RoPE cast point (either may still be given
        explicitly); also the engine label when labels has none.
        precision: the engine's arithmetic (docs/NUMERICS.md, "Engine
        precision"): a profile name ("vllm_cpu", "hf_eager",
        "torch_flash_cpu", "flash_decoding", "custom") or a dict with
        profile, score_dtype, probability_dtype, exp_ulps, split_keys.
        Undeclared: the conservative profile.
        rope_table: the engine's own RoPE values, a dict with inv_freq
        [rotary_dim / 2] and/or positions [T] with cos and sin
        [T, rotary_dim / 2] (the rows of its cos/sin cache that the step
        used); attnaudit rotates with them and checks them.
        pre_rope_q [B, (Sq,) Hq, D], pre_rope_k [B, (Sq,) Hkv, D]: this
        step's queries and new keys before RoPE, for the rolling RoPE check
        (q and the cache hold them rotated).
        """
        # Every keyword option, by name (the parameters of _apply_options).
        options = {name: value for name, value in locals().items() if name in OPTION_NAMES}
        plan = A.CopyPlan()
        dims, tensors = _layout_tensors(plan, q, k_pages, v_pages, {
            "block_table": block_table, "kv_seq_lens": kv_seq_lens,
            "query_positions": query_positions, "slot_positions": slot_positions,
            "page_ids": page_ids, "key_rope_positions": key_rope_positions})
        meta = snapshot_pb2.Snapshot(kv_layout=E.parse_enum(*E.KV_LAYOUT, kv_layout, "kv_layout"))
        auto = _apply_options(meta, tensors, plan, dims, max_blocks=_max_blocks(tensors),
                              **options)
        plan.finish()
        return cls(meta, tensors, gathered_event=plan.gathered_event,
                   auto_prefix_fingerprint=auto)

    # ------------------------------------------------------------------
    # Protobuf and files
    # ------------------------------------------------------------------

    @classmethod
    def from_proto(cls, message: snapshot_pb2.Snapshot) -> "Snapshot":
        """A Snapshot holding the message's fields and tensor bytes."""
        meta = snapshot_pb2.Snapshot()
        meta.CopyFrom(message)
        tensors: Dict[str, A.WireTensor] = {}
        for path in _wire.TENSOR_PATHS:
            parent, _, name = path.rpartition(".")
            holder = meta
            if parent:
                if not meta.HasField(parent):
                    continue
                holder = getattr(meta, parent)
            if not holder.HasField(name):
                continue
            t = getattr(holder, name)
            tensors[path] = A.WireTensor.from_bytes(t.dtype, list(t.shape), t.data)
            holder.ClearField(name)
        return cls(meta, tensors)

    def to_proto(self) -> snapshot_pb2.Snapshot:
        """The complete attnaudit.v1.Snapshot message (copies the bytes)."""
        return snapshot_pb2.Snapshot.FromString(self.serialize())

    def serialize(self) -> bytes:
        """The binary attnaudit.v1.Snapshot encoding (one copy of the bytes)."""
        return b"".join(self.pieces())

    def pieces(self) -> List[Any]:
        """The encoding as a list of bytes/memoryview pieces (no copy)."""
        self.wait()
        return _wire.snapshot_pieces(self._meta, self._tensors)

    def file_pieces(self) -> List[Any]:
        """The encoding of a snapshot file (each tensor's data 64-byte
        aligned, so a reader can use it in place), as pieces (no copy)."""
        self.wait()
        return _wire.snapshot_pieces(self._meta, self._tensors, align=True)

    @classmethod
    def load(cls, path: str) -> "Snapshot":
        """Reads a snapshot file (`attnaudit synth` output, or save())."""
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise ValueError(f"{path}: empty file, not an attnaudit.v1.Snapshot")
        message = snapshot_pb2.Snapshot()
        try:
            message.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and kin
            raise ValueError(f"{path}: not a valid attnaudit.v1.Snapshot "
                             "(truncated or corrupt protobuf)") from None
        del data
        return cls.from_proto(message)

    def save(self, path: str) -> None:
        """Writes the snapshot file atomically (temporary file in the same
        directory, fsync, rename, fsync of the directory): the format of
        `attnaudit synth`, readable by `attnaudit check/audit/inspect`."""
        pieces = self.file_pieces()
        size = sum(len(p) if isinstance(p, (bytes, bytearray)) else p.nbytes
                   for p in pieces)
        if size > (1 << 31) - 1:
            raise ValueError(f"{path}: the snapshot encodes to {size} bytes, over "
                             "the 2 GiB limit of a snapshot file (a protobuf "
                             "message); audit it over the network instead")
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.",
                                   dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                for p in pieces:
                    f.write(p)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # ------------------------------------------------------------------
    # Access
    # ------------------------------------------------------------------

    def wait(self) -> None:
        """Waits for pending device-to-host copies and finishes derived
        fields (an "auto" prefix fingerprint). Idempotent, thread-safe."""
        for t in self._tensors.values():
            t.wait()
        if self._auto_prefix:
            self._auto_prefix = False
            self._meta.prefix.fingerprint = prefix_fingerprint(
                self, self._meta.prefix.length, self._meta.prefix.key)

    @property
    def meta(self) -> snapshot_pb2.Snapshot:
        """The non-tensor fields (a live message: edits change the snapshot)."""
        return self._meta

    @property
    def labels(self) -> snapshot_pb2.Labels:
        """The labels message (live)."""
        return self._meta.labels

    def tensor_paths(self) -> Tuple[str, ...]:
        return tuple(p for p in _wire.TENSOR_PATHS if p in self._tensors)

    def tensor(self, path: str) -> np.ndarray:
        """A read-only numpy view of tensor `path` ("q", "engine.out", ...);
        bf16/fp8 as ml_dtypes arrays. KeyError when absent."""
        return self._tensors[path].array()

    def wire_tensor(self, path: str) -> A.WireTensor:
        return self._tensors[path]

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors (the bulk of the encoded size)."""
        return sum(t.nbytes for t in self._tensors.values())

    @property
    def dims(self) -> Dict[str, int]:
        """B, Sq, Hq, D from q; N, P, Hkv from k_pages (its layout)."""
        B, Sq, Hq, D = self._tensors["q"].shape
        k = self._tensors["k_pages"].shape
        hnd = self._meta.kv_layout == snapshot_pb2.KV_LAYOUT_HND
        return {"B": B, "Sq": Sq, "Hq": Hq, "D": D, "N": k[0],
                "P": k[2] if hnd else k[1], "Hkv": k[1] if hnd else k[2]}

    def __repr__(self) -> str:
        try:
            d = self.dims
            shape = " ".join(f"{k}={v}" for k, v in d.items())
        except (KeyError, ValueError):
            shape = "?"
        kv = self._tensors.get("k_pages")
        kv_name = A.NAMES.get(kv.dtype, "?") if kv is not None else "?"
        return f"<attnaudit.Snapshot {shape} kv={kv_name} bytes={self.nbytes}>"


# ----------------------------------------------------------------------
# Paging
# ----------------------------------------------------------------------


def _pool_views(k_cache: Any, v_cache: Any, layout: str,
                head_dim: int) -> Tuple[Any, Any, bool]:
    """(K pool, V pool, hnd) as views of the engine's cache (no copy)."""
    k_cache = A.as_array(k_cache, "k_cache")
    if layout == _LAYOUT_VLLM_CPU:
        return _vllm_cpu_views(k_cache, v_cache, head_dim)
    if v_cache is None:
        if layout not in _LAYOUTS_FUSED:
            raise ValueError(
                f"layout: {layout!r} needs separate k_cache and v_cache; a fused "
                "K/V tensor is one of " + ", ".join(sorted(_LAYOUTS_FUSED)))
        axis, hnd = _LAYOUTS_FUSED[layout]
        shape = tuple(k_cache.shape)
        if len(shape) != 5 or shape[axis] != 2:
            want = ("[2, num_blocks, block_size, Hkv, D]" if axis == 0 else
                    "[num_blocks, 2, Hkv, block_size, D]" if hnd else
                    "[num_blocks, 2, block_size, Hkv, D]")
            raise ValueError(f"k_cache: shape {shape} is not the fused {layout!r} "
                             f"layout {want}")
        if axis == 0:
            return k_cache[0], k_cache[1], hnd
        return k_cache[:, 0], k_cache[:, 1], hnd
    if layout not in _LAYOUTS_SPLIT:
        raise ValueError(f"layout: unknown {layout!r}; expected one of "
                         + ", ".join(sorted(set(_LAYOUTS_FUSED) | set(_LAYOUTS_SPLIT))))
    v_cache = A.as_array(v_cache, "v_cache")
    hnd = _LAYOUTS_SPLIT[layout]
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if len(t.shape) != 4:
            want = ("[num_blocks, Hkv, block_size, D]" if hnd else
                    "[num_blocks, block_size, Hkv, D]")
            raise ValueError(f"{name}: shape {tuple(t.shape)} must be {want} "
                             f"(layout {layout!r})")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} differs from "
                         f"k_cache shape {tuple(k_cache.shape)}")
    return k_cache, v_cache, hnd


def _vllm_cpu_views(k_cache: Any, v_cache: Any, head_dim: int) -> Tuple[Any, Any, bool]:
    """Logical [num_blocks, Hkv, block_size, D] views of vLLM's CPU cache:
    the fused tensor [num_blocks, Hkv, 2 * block_size, D] (or as the backend
    allocates it, [num_blocks, Hkv, block_size, 2 * D], the same memory), or
    the key/value halves the backend slices from it (key_cache's memory is K
    transposed per block and head)."""
    want = "[num_blocks, Hkv, 2 * block_size, D] (or its two halves)"
    shape = tuple(int(d) for d in k_cache.shape)
    if v_cache is None and len(shape) == 4 and shape[3] == 2 * head_dim:
        k_cache = k_cache.reshape(shape[0], shape[1], 2 * shape[2], head_dim)
        shape = tuple(int(d) for d in k_cache.shape)
    if len(shape) != 4:
        raise ValueError(f"k_cache: shape {shape} is not vLLM's CPU layout {want}")
    nb, hkv, rows, D = shape
    P = rows // 2 if v_cache is None else rows
    if v_cache is None and rows % 2:
        raise ValueError(f"k_cache: shape {shape} is not vLLM's CPU layout {want}")
    if A.is_torch(k_cache):
        st = k_cache.stride()
        if st[2:] != (D, 1):
            raise ValueError(f"k_cache: rows of D={D} contiguous values expected "
                             f"in vLLM's CPU layout, got strides {st}")
        k = k_cache.as_strided((nb, hkv, P, D), (st[0], st[1], 1, P),
                               k_cache.storage_offset())
        v = k_cache[:, :, P:, :] if v_cache is None else v_cache
    else:
        st = k_cache.strides
        item = k_cache.itemsize
        if st[2:] != (D * item, item):
            raise ValueError(f"k_cache: rows of D={D} contiguous values expected "
                             f"in vLLM's CPU layout, got strides {st}")
        k = np.lib.stride_tricks.as_strided(
            k_cache, (nb, hkv, P, D), (st[0], st[1], item, P * item),
            writeable=False)
        v = k_cache[:, :, P:, :] if v_cache is None else A.as_array(v_cache, "v_cache")
    if tuple(int(d) for d in v.shape) != (nb, hkv, P, D):
        raise ValueError(f"v_cache: shape {tuple(v.shape)} must be "
                         f"[{nb}, {hkv}, {P}, {D}] (vLLM's CPU layout)")
    return k, v, True


class _Paging:
    """The pages a batch references, renumbered, and their slot positions."""

    def __init__(self, table: np.ndarray, lens: np.ndarray, P: int,
                 num_blocks: int, key_pos: Optional[np.ndarray]):
        if (lens < 1).any():
            b = int(np.argmax(lens < 1))
            raise ValueError(f"seq_lens[{b}]: {int(lens[b])} must be >= 1")
        nblocks = (lens + P - 1) // P
        M = int(nblocks.max())
        if M > table.shape[1]:
            b = int(np.argmax(nblocks))
            raise ValueError(f"block_table: row {b} needs {int(nblocks[b])} blocks "
                             f"for seq_lens[{b}]={int(lens[b])} (page size {P}) but "
                             f"the table has {table.shape[1]} columns")
        cols = np.arange(M)
        active = cols[None, :] < nblocks[:, None]  # [B, M]
        table = table[:, :M]
        ids = table[active]
        bad = (ids < 0) | (ids >= num_blocks)
        if bad.any():
            rows, js = np.nonzero(active)
            i = int(np.argmax(bad))
            raise ValueError(f"block_table[{int(rows[i])}][{int(js[i])}]: page id "
                             f"{int(ids[i])} is outside the cache's "
                             f"[0, {num_blocks}) blocks")
        self.page_ids = np.unique(ids)
        self.block_table = np.where(active, table, -1)
        local = np.searchsorted(self.page_ids, table)  # valid where active
        # Position of every logical token of every active block: [E, P].
        rows, js = np.nonzero(active)
        tokens = js[:, None] * P + np.arange(P)[None, :]
        valid = tokens < lens[rows][:, None]
        if key_pos is None:
            values = tokens
        else:
            values = key_pos[rows[:, None], np.minimum(tokens, key_pos.shape[1] - 1)]
        pages = np.broadcast_to(local[rows, js][:, None], tokens.shape)
        slots = np.broadcast_to(np.arange(P)[None, :], tokens.shape)
        slot_pos = np.full((len(self.page_ids), P), -1, dtype=np.int64)
        # The first row naming a page sets its positions, so that a clash is
        # reported at the later entry.
        flat = pages[valid] * P + slots[valid]
        _, first = np.unique(flat, return_index=True)
        slot_pos.reshape(-1)[flat[first]] = values[valid][first]
        # A page shared by several rows must hold one set of positions.
        clash = slot_pos[pages[valid], slots[valid]] != values[valid]
        if clash.any():
            e = np.nonzero(valid)
            i = int(np.argmax(clash))
            r, j = int(rows[e[0][i]]), int(js[e[0][i]])
            raise ValueError(
                f"block_table[{r}][{j}]: page id {int(table[r, j])} is shared with "
                "another row at a different position (a shared page must be the "
                "same logical block with the same positions in every row); pass "
                "key_positions if the rows' positions differ")
        self.slot_positions = slot_pos
        self.lens = lens
        self._key_pos = key_pos

    def position(self, b: int, token: np.ndarray) -> np.ndarray:
        if self._key_pos is None:
            return token
        return self._key_pos[b, token]


def _key_positions(key_positions: Any, B: int, lens: np.ndarray) -> Optional[np.ndarray]:
    if key_positions is None:
        return None
    kp = A.host_numpy(key_positions, "key_positions").astype(np.int64)
    if kp.ndim != 2 or kp.shape[0] != B or kp.shape[1] < int(lens.max()):
        raise ValueError(f"key_positions: shape {tuple(kp.shape)} must be [B={B}, T] "
                         f"with T >= max(seq_lens)={int(lens.max())}")
    return kp


def _query_positions(query_positions: Any, paging: _Paging, B: int, Sq: int) -> np.ndarray:
    if query_positions is not None:
        qp = A.host_numpy(query_positions, "query_positions").astype(np.int64)
        if qp.ndim == 1 and Sq == 1:
            qp = qp[:, None]
        if qp.shape != (B, Sq):
            raise ValueError(f"query_positions: shape {tuple(qp.shape)} must be "
                             f"[B={B}, Sq={Sq}]" + (" or [B]" if Sq == 1 else ""))
        return qp
    out = np.empty((B, Sq), dtype=np.int64)
    for b in range(B):
        L = int(paging.lens[b])
        if L < Sq:
            raise ValueError(f"seq_lens[{b}]: {L} tokens cannot hold Sq={Sq} queries")
        out[b] = paging.position(b, np.arange(L - Sq, L))
    return out


def _int_vector(x: Any, what: str, n: int) -> np.ndarray:
    a = A.host_numpy(x, what)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"{what}: shape {tuple(a.shape)} must be [B={n}]")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what}: must hold integers, got {a.dtype}")
    return a.astype(np.int64)


def _own_int(plan: A.CopyPlan, value: Any, what: str) -> A.WireTensor:
    a = A.as_array(value, what)
    if A.is_torch(a) or (isinstance(a, np.ndarray) and a.dtype in (np.int32, np.int64)):
        return plan.own(a, what)
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what}: must hold integers, got {a.dtype}")
    return A.int_tensor(a)


# ----------------------------------------------------------------------
# Keyword options
# ----------------------------------------------------------------------


def _as_bsq(x: Any, what: str, trailing: int, flat: Optional[Tuple[int, int]] = None,
            sq: Optional[int] = None, b: Optional[int] = None) -> Any:
    """x as [B, Sq, *trailing dims]; a decode tensor without the Sq dim
    ([B, *trailing]) gets it; with `flat`, [B, flat] becomes [B, 1, Hq, D]."""
    shape = tuple(int(d) for d in x.shape)
    if len(shape) == trailing + 2:
        return x
    if len(shape) == trailing + 1 and (sq is None or sq == 1):
        return x[:, None] if isinstance(x, np.ndarray) else x.unsqueeze(1)
    if flat is not None and len(shape) == 2 and shape[1] == flat[0] * flat[1]:
        return x.reshape(shape[0], 1, flat[0], flat[1])
    raise ValueError(f"{what}: shape {shape} has the wrong rank")


def _check_shape(x: Any, what: str, want: Tuple[int, ...], names: str,
                 hint: str = "") -> None:
    got = tuple(int(d) for d in x.shape)
    if got != want:
        raise ValueError(f"{what}: shape {got} must be {names}={list(want)}{hint}")


def _float_or_none(value: Any, what: str) -> float:
    if value is None:
        return 0.0
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{what}: must be a number, got NaN")
    return v


def _layout_tensors(plan: A.CopyPlan, q: Any, k_pages: Any, v_pages: Any,
                    ints: Dict[str, Any]) -> Tuple[Tuple[int, ...], Dict[str, A.WireTensor]]:
    """The dims of q [B, Sq, Hq, D] and the owned copies of q, the page pools
    and the integer layout tensors given (None: absent)."""
    q4 = A.as_array(q, "q")
    if len(q4.shape) != 4:
        raise ValueError(f"q: shape {tuple(q4.shape)} must be [B, Sq, Hq, D]")
    dims = tuple(int(d) for d in q4.shape)
    tensors = {"q": plan.own(q4, "q"),
               "k_pages": plan.own(k_pages, "k_pages"),
               "v_pages": plan.own(v_pages, "v_pages")}
    for name, value in ints.items():
        if value is not None:
            tensors[name] = _own_int(plan, value, name)
    return dims, tensors


def _max_blocks(tensors: Dict[str, A.WireTensor]) -> int:
    shape = tensors["block_table"].shape
    return shape[1] if len(shape) == 2 else 0


def _apply_options(meta: snapshot_pb2.Snapshot, tensors: Dict[str, A.WireTensor], plan: A.CopyPlan,
                   dims: Sequence[int], *, max_blocks: int, softmax_scale: Any = None,
                   sliding_window: Any = None, window_convention: Any = None,
                   logit_softcap: Any = None, sinks: Any = None,
                   engine_lse_includes_sinks: Any = False, rope: Any = None,
                   output_dtype: Any = None, k_scale: Any = None, v_scale: Any = None,
                   cp_world_size: Any = None, cp_sharding: Any = None,
                   cp_interleave_size: Any = None, cp_block_owners: Any = None,
                   cp_rank_out: Any = None, cp_rank_lse: Any = None, engine_out: Any = None,
                   engine_lse: Any = None, lse_base: Any = None, engine_logprobs: Any = None,
                   selected_token_ids: Any = None, lm_head: Any = None, active_mask: Any = None,
                   logprob_temperature: Any = None, prefix_key: Any = None,
                   prefix_length: Any = None, prefix_fingerprint: Any = None,
                   prefix_scheme: Any = None, labels: Any = None, engine: Any = None,
                   precision: Any = None, rope_table: Any = None, pre_rope_q: Any = None,
                   pre_rope_k: Any = None) -> bool:
    """Fills the optional fields; returns True when the prefix fingerprint
    is to be computed at encode time ("auto")."""
    B, Sq, Hq, D = dims
    meta.softmax_scale = _float_or_none(softmax_scale, "softmax_scale")
    meta.sliding_window = int(sliding_window or 0)
    if window_convention is not None:
        meta.window_convention = E.parse_enum(*E.WINDOW, window_convention,
                                              "window_convention", E.WINDOW_ALIASES)
    meta.logit_softcap = _float_or_none(logit_softcap, "logit_softcap")
    if sinks is not None:
        s = A.as_array(sinks, "sinks")
        _check_shape(s, "sinks", (Hq,), "[Hq]")
        tensors["sinks"] = plan.own(s, "sinks", A.F32)
    meta.engine_lse_includes_sinks = bool(engine_lse_includes_sinks)
    preset = _engine_preset(engine)
    if rope is not None:
        meta.rope.CopyFrom(rope_config(rope))
    if preset and not (isinstance(rope, Mapping) and rope.get("cast_point")):
        meta.rope.cast_point = E.parse_enum(*E.CAST_POINT, preset["cast_point"],
                                            "rope.cast_point")
    if precision is not None:
        meta.precision.CopyFrom(engine_precision(precision))
    elif preset:
        style = "gptj" if meta.rope.style == snapshot_pb2.ROPE_STYLE_GPTJ else "neox"
        meta.precision.CopyFrom(engine_precision(
            _preset_precision(engine, tensors["q"].dtype, style)))
    _apply_rope_inputs(tensors, plan, dims, rope_table, pre_rope_q, pre_rope_k)
    if output_dtype is not None:
        meta.output_dtype = E.wire(A.dtype_code(output_dtype, "output_dtype"))
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if value is not None:
            tensors[name] = _scale(plan, value, name)
    _apply_cp(meta, tensors, plan, dims, max_blocks, cp_world_size, cp_sharding,
              cp_interleave_size, cp_block_owners, cp_rank_out, cp_rank_lse)
    _apply_engine(meta, tensors, plan, dims, engine_out, engine_lse, lse_base,
                  engine_logprobs, has_rank_lse=cp_rank_lse is not None)
    for name, value in (("selected_token_ids", selected_token_ids),
                        ("active_mask", active_mask)):
        if value is not None:
            x = _as_bsq(A.as_array(value, name), name, 0, sq=Sq)
            _check_shape(x, name, (B, Sq), "[B, Sq]")
            if name == "active_mask":
                tensors[name] = plan.own(x, name, A.BOOL)
            else:
                tensors[name] = _own_int(plan, x, name)
    if lm_head is not None:
        w = A.as_array(lm_head, "lm_head")
        if len(w.shape) != 2 or int(w.shape[1]) != Hq * D:
            raise ValueError(f"lm_head: shape {tuple(w.shape)} must be [V, Hq*D={Hq * D}]")
        tensors["lm_head"] = plan.own(w, "lm_head")
    meta.logprob_temperature = _float_or_none(logprob_temperature, "logprob_temperature")
    auto = _apply_prefix(meta, prefix_key, prefix_length, prefix_fingerprint,
                         prefix_scheme)
    if labels is not None:
        meta.labels.CopyFrom(make_labels(labels))
    if engine is not None and not meta.labels.engine:
        meta.labels.engine = str(engine)
    return auto


# The keyword options of the builders (from_arrays, and from_paged_kv through
# it): the keyword parameters of _apply_options but max_blocks.
OPTION_NAMES = frozenset(
    name for name, p in inspect.signature(_apply_options).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "max_blocks")


def _engine_preset(engine: Any) -> Optional[Dict[str, str]]:
    """engine's preset; "hf-eager/<family>" and "hf-sdpa/<family>" take the
    family's RoPE cast point (HF_FAMILY_CAST_POINTS)."""
    if engine is None:
        return None
    base, _, family = str(engine).lower().partition("/")
    preset = ENGINE_PRESETS.get(base)
    if preset is None or (family and not base.startswith("hf-")):
        raise ValueError(f"engine: unknown {engine!r}; expected one of "
                         + ", ".join(sorted(ENGINE_PRESETS))
                         + " (hf-eager and hf-sdpa also as hf-eager/<family>)")
    if family:
        preset = dict(preset, cast_point=HF_FAMILY_CAST_POINTS.get(family, HF_DEFAULT_CAST_POINT))
    return preset


def _preset_precision(engine: Any, q_dtype: int, rope_style: str) -> Dict[str, Any]:
    """An engine preset's precision resolved by what is known without
    running the engine (attnaudit.probe.preset: vllm-cpu's bf16 rounding by
    the CPU's ISA and the RoPE style), source "preset"."""
    name = A.NAMES.get(q_dtype, "")
    if name in ("bf16", "f16", "f32"):
        from .probe import preset  # late: the probe's imports cost ~20 ms
        return preset(str(engine).partition("/")[0], name, rope_style=rope_style)
    return {"profile": _engine_preset(engine)["precision"], "source": "preset",  # type: ignore[index]
            "evidence": f"engine preset {str(engine).lower()!r}"}


_ROUNDING_KEYS = ("score_rounding", "probability_rounding", "output_rounding",
                  "rope_rounding")
_PRECISION_KEYS = frozenset(("profile", "score_dtype", "probability_dtype",
                             "exp_ulps", "split_keys", "source", "evidence")
                            + _ROUNDING_KEYS)


def engine_precision(value: Any) -> snapshot_pb2.EnginePrecision:
    """An attnaudit.v1.EnginePrecision from a profile name, a dict or the
    message. Dict keys: profile, score_dtype, probability_dtype, exp_ulps,
    split_keys; score_rounding, probability_rounding, output_rounding,
    rope_rounding ("nearest_even" or "toward_zero", alias "truncate");
    source ("preset", "measured") and evidence (a line, <= 1,024 bytes)."""
    if isinstance(value, snapshot_pb2.EnginePrecision):
        return value
    if isinstance(value, str):
        value = {"profile": value}
    if not isinstance(value, Mapping):
        raise TypeError("precision: expected a profile name, a dict or an "
                        f"attnaudit.v1.EnginePrecision, got {type(value).__name__}")
    unknown = set(value) - _PRECISION_KEYS
    if unknown:
        raise TypeError(f"precision: unknown key(s) {sorted(unknown)}; expected "
                        + ", ".join(sorted(_PRECISION_KEYS)))
    out = snapshot_pb2.EnginePrecision()
    if value.get("profile") is not None:
        out.profile = E.parse_enum(*E.ENGINE_PROFILE, value["profile"],
                                   "precision.profile", E.PROFILE_ALIASES)
    for k in ("score_dtype", "probability_dtype"):
        if value.get(k) is not None:
            setattr(out, k, A.dtype_code(value[k], f"precision.{k}"))
    for k in ("exp_ulps", "split_keys"):
        if value.get(k) is not None:
            setattr(out, k, int(value[k]))
    for k in _ROUNDING_KEYS:
        if value.get(k) is not None:
            setattr(out, k, E.parse_enum(*E.ROUNDING, value[k],
                                         f"precision.{k}", E.ROUNDING_ALIASES))
    if value.get("source") is not None:
        out.source = E.parse_enum(*E.PRECISION_SOURCE, value["source"],
                                  "precision.source")
    if value.get("evidence") is not None:
        out.evidence = str(value["evidence"])
    return out


def _apply_rope_inputs(tensors: Any, plan: Any, dims: Any, table: Any, pre_q: Any,
                       pre_k: Any) -> None:
    B, Sq, Hq, D = dims
    if pre_q is not None:
        x = _as_bsq(A.as_array(pre_q, "pre_rope_q"), "pre_rope_q", 2, sq=Sq)
        _check_shape(x, "pre_rope_q", (B, Sq, Hq, D), "[B, Sq, Hq, D]")
        tensors["pre_rope.q"] = plan.own(x, "pre_rope_q")
    if pre_k is not None:
        x = _as_bsq(A.as_array(pre_k, "pre_rope_k"), "pre_rope_k", 2, sq=Sq)
        if len(x.shape) != 4 or int(x.shape[0]) != B or int(x.shape[1]) != Sq \
                or int(x.shape[3]) != D:
            raise ValueError(f"pre_rope_k: shape {tuple(int(d) for d in x.shape)} "
                             f"must be [B={B}, Sq={Sq}, Hkv, D={D}]")
        tensors["pre_rope.k"] = plan.own(x, "pre_rope_k")
    if table is None:
        return
    if not isinstance(table, Mapping):
        raise TypeError("rope_table: expected a dict with inv_freq and/or "
                        "positions, cos, sin")
    unknown = set(table) - {"inv_freq", "positions", "cos", "sin"}
    if unknown:
        raise TypeError(f"rope_table: unknown key(s) {sorted(unknown)}")
    if table.get("inv_freq") is not None:
        tensors["rope_table.inv_freq"] = plan.own(
            A.as_array(table["inv_freq"], "rope_table.inv_freq"),
            "rope_table.inv_freq", A.F32)
    rows = [table.get(k) is not None for k in ("positions", "cos", "sin")]
    if any(rows) and not all(rows):
        raise ValueError("rope_table: positions, cos and sin come together")
    if all(rows):
        tensors["rope_table.positions"] = _own_int(plan, table["positions"],
                                                   "rope_table.positions")
        for k in ("cos", "sin"):
            tensors[f"rope_table.{k}"] = plan.own(
                A.as_array(table[k], f"rope_table.{k}"), f"rope_table.{k}")


def _scale(plan: A.CopyPlan, value: Any, what: str) -> A.WireTensor:
    if isinstance(value, (int, float)):
        a = np.asarray(value, dtype=np.float32)
        return A.WireTensor(A.F32, (), a.reshape(-1).view(np.uint8).copy())
    x = A.as_array(value, what)
    if len(x.shape) == 1 and int(x.shape[0]) == 1:
        x = x.reshape(())  # vLLM keeps per-tensor scales as [1]
    return plan.own(x, what, A.F32)


def _apply_cp(meta: Any, tensors: Any, plan: Any, dims: Any, max_blocks: Any, world: Any,
              sharding: Any, interleave: Any, owners: Any, rank_out: Any, rank_lse: Any) -> None:
    B, Sq, Hq, D = dims
    if all(v is None for v in (world, sharding, interleave, owners, rank_out, rank_lse)):
        return
    meta.cp.world_size = int(world or 0)
    if sharding is not None:
        meta.cp.sharding = E.parse_enum(*E.CP_SHARDING, sharding, "cp_sharding")
    meta.cp.interleave_size = int(interleave or 0)
    W = max(1, meta.cp.world_size)
    if owners is not None:
        o = A.host_numpy(owners, "cp_block_owners").astype(np.int64)
        if o.ndim != 2 or o.shape[0] != B or o.shape[1] < max_blocks:
            raise ValueError(f"cp_block_owners: shape {tuple(o.shape)} must be "
                             f"[B={B}, M>={max_blocks}]")
        o = o[:, :max_blocks].copy()
        bt = tensors["block_table"].array()
        o[bt < 0] = -1
        tensors["cp.block_owners"] = A.int_tensor(o)
    if rank_out is not None:
        x = _as_bsq_rank(A.as_array(rank_out, "cp_rank_out"), "cp_rank_out", 2, Sq)
        _check_shape(x, "cp_rank_out", (W, B, Sq, Hq, D), "[W, B, Sq, Hq, D]")
        tensors["cp.rank_out"] = plan.own(x, "cp_rank_out")
    if rank_lse is not None:
        x = _as_bsq_rank(A.as_array(rank_lse, "cp_rank_lse"), "cp_rank_lse", 1, Sq)
        _check_shape(x, "cp_rank_lse", (W, B, Sq, Hq), "[W, B, Sq, Hq]")
        tensors["cp.rank_lse"] = plan.own(x, "cp_rank_lse")


def _as_bsq_rank(x: Any, what: str, trailing: int, sq: int) -> Any:
    shape = tuple(x.shape)
    if len(shape) == trailing + 2 and sq == 1:  # [W, B, ...] without Sq
        return x[:, :, None] if isinstance(x, np.ndarray) else x.unsqueeze(2)
    if len(shape) == trailing + 3:
        return x
    raise ValueError(f"{what}: shape {tuple(int(d) for d in shape)} has the wrong rank")


def _apply_engine(meta: Any, tensors: Any, plan: Any, dims: Any, out: Any, lse: Any, lse_base: Any,
                  logprobs: Any, has_rank_lse: bool) -> None:
    B, Sq, Hq, D = dims
    if (lse is not None or has_rank_lse) and lse_base is None:
        raise ValueError(
            "lse_base: required with engine_lse / cp_rank_lse: say \"e\" (natural "
            "log: FlashAttention, PyTorch) or \"2\" (FlashInfer and some Triton "
            "kernels); there is no default, a wrong base is a classic bug")
    if lse_base is not None:
        meta.engine.lse_base = E.parse_enum(*E.LSE_BASE, str(lse_base), "lse_base")
    if out is not None:
        x = _as_bsq(A.as_array(out, "engine_out"), "engine_out", 2, flat=(Hq, D), sq=Sq)
        _check_shape(x, "engine_out", (B, Sq, Hq, D), "[B, Sq, Hq, D]")
        tensors["engine.out"] = plan.own(x, "engine_out")
    if lse is not None:
        x = A.as_array(lse, "engine_lse")
        hint = ""
        if tuple(int(d) for d in x.shape) == (Hq, B) and B != Hq:
            hint = " (FlashAttention returns lse as [Hq, B]: pass lse.T)"
        x = _as_bsq(x, "engine_lse", 1, sq=Sq) if len(x.shape) in (2, 3) else x
        _check_shape(x, "engine_lse", (B, Sq, Hq), "[B, Sq, Hq]", hint)
        tensors["engine.lse"] = plan.own(x, "engine_lse")
    if logprobs is not None:
        x = _as_bsq(A.as_array(logprobs, "engine_logprobs"), "engine_logprobs", 0, sq=Sq)
        _check_shape(x, "engine_logprobs", (B, Sq), "[B, Sq]")
        tensors["engine.logprobs"] = plan.own(x, "engine_logprobs")


def _apply_prefix(meta: Any, key: Any, length: Any, fingerprint: Any, scheme: Any) -> bool:
    if key is None and length is None and fingerprint is None:
        return False
    if not key or not length:
        raise ValueError("prefix_key: prefix_key and a positive prefix_length "
                         "declare a cached prefix together")
    meta.prefix.enabled = True
    meta.prefix.key = str(key)
    meta.prefix.length = int(length)
    if scheme is not None:
        meta.prefix.scheme = E.parse_enum(*E.SCHEME, scheme, "prefix_scheme")
    auto = fingerprint == "auto"
    if auto and meta.prefix.scheme == snapshot_pb2.FINGERPRINT_SCHEME_RL_KERNEL_COMPAT:
        raise ValueError("prefix_fingerprint: \"auto\" computes the attnaudit_v1 "
                         "digest; pass the RL-Kernel digest yourself")
    if fingerprint is not None and not auto:
        meta.prefix.fingerprint = str(fingerprint)
    return auto


def make_labels(labels: Any) -> snapshot_pb2.Labels:
    """An attnaudit.v1.Labels from a dict or a Labels message. Keys: model,
    engine, backend, run, weight_version (text); layer, step (ints);
    request_ids (one per sequence); role: "rollout" or "trainer" (or
    snapshot_pb2.SNAPSHOT_ROLE_*), the side of a train-rollout pair. A
    snapshot with a role, run, layer and request_ids is a pair side: once
    audited, the server joins it with the other role's snapshot of the same
    run and layer that holds the same (request id, position) rows
    (AuditClient.list_pairs). weight_version names the policy weights the
    snapshot was computed under (e.g. the step of the last weight sync).
    None values are left unset. An unknown key raises TypeError, an unknown
    role ValueError, each naming the key."""
    if isinstance(labels, snapshot_pb2.Labels):
        return labels
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels: expected a dict or attnaudit.v1.Labels, got "
                        f"{type(labels).__name__}")
    out = snapshot_pb2.Labels()
    for k, v in labels.items():
        if k in ("model", "engine", "backend", "run", "weight_version"):
            if v is not None:
                setattr(out, k, str(v))
        elif k in ("layer", "step"):
            if v is not None:
                setattr(out, k, int(v))
        elif k == "request_ids":
            out.request_ids.extend(str(r) for r in v)
        elif k == "role":
            if v is not None:
                out.role = E.parse_enum(*E.SNAPSHOT_ROLE, v, "labels.role")
        else:
            raise TypeError(f"labels: unknown key {k!r}; expected model, layer, "
                            "engine, backend, step, run, request_ids, role, "
                            "weight_version")
    return out


_ROPE_KEYS = {"theta", "rope_theta", "style", "q_state", "k_state", "rotary_dim",
              "scaling", "rope_scaling", "q_output_dtype", "k_output_dtype",
              "cast_point"}


def rope_config(rope: Any) -> snapshot_pb2.RopeConfig:
    """An attnaudit.v1.RopeConfig from a dict (see Snapshot.from_arrays) or
    a RopeConfig message."""
    if isinstance(rope, snapshot_pb2.RopeConfig):
        return rope
    if not isinstance(rope, Mapping):
        raise TypeError(f"rope: expected a dict or attnaudit.v1.RopeConfig, got "
                        f"{type(rope).__name__}")
    unknown = set(rope) - _ROPE_KEYS
    if unknown:
        raise TypeError(f"rope: unknown key(s) {sorted(unknown)}; expected "
                        + ", ".join(sorted(_ROPE_KEYS)))
    out = snapshot_pb2.RopeConfig()
    theta = rope.get("theta", rope.get("rope_theta"))
    if theta is not None:
        out.theta = float(theta)
    if rope.get("style") is not None:
        out.style = E.parse_enum(*E.ROPE_STYLE, rope["style"], "rope.style")
    for k in ("q_state", "k_state"):
        if rope.get(k) is not None:
            setattr(out, k, E.parse_enum(*E.ROPE_STATE, rope[k], f"rope.{k}",
                                         E.ROPE_STATE_ALIASES))
    if rope.get("rotary_dim") is not None:
        out.rotary_dim = int(rope["rotary_dim"])
    for k in ("q_output_dtype", "k_output_dtype"):
        if rope.get(k) is not None:
            setattr(out, k, A.dtype_code(rope[k], f"rope.{k}"))
    if rope.get("cast_point") is not None:
        out.cast_point = E.parse_enum(snapshot_pb2.RopeCastPoint, "ROPE_CAST_POINT_",
                                      rope["cast_point"], "rope.cast_point")
    scaling = rope.get("scaling", rope.get("rope_scaling"))
    if scaling:
        out.scaling.CopyFrom(_rope_scaling(scaling))
    return out


def _rope_scaling(s: Any) -> snapshot_pb2.RopeScaling:
    if isinstance(s, snapshot_pb2.RopeScaling):
        return s
    out = snapshot_pb2.RopeScaling()
    kind = s.get("type", s.get("rope_type"))
    if kind is None:
        raise ValueError("rope.scaling: needs a type (or rope_type)")
    out.type = E.parse_enum(*E.ROPE_SCALING, kind, "rope.scaling.type",
                            E.SCALING_ALIASES)
    for k in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast",
              "beta_slow", "attention_factor"):
        if s.get(k) is not None:
            setattr(out, k, float(s[k]))
    omp = s.get("original_max_position", s.get("original_max_position_embeddings"))
    if omp is not None:
        out.original_max_position = int(omp)
    if s.get("truncate") is not None:  # Hugging Face's YaRN flag
        out.no_truncate = not bool(s["truncate"])
    if out.type == snapshot_pb2.ROPE_SCALING_TYPE_DYNAMIC:
        _dynamic_scaling(s, out)
    elif out.type == snapshot_pb2.ROPE_SCALING_TYPE_LONGROPE:
        _longrope_scaling(s, out)
    return out


def _sequence_length(s: Mapping, kind: str, engines: str) -> int:
    n = s.get("sequence_length")
    if n is None:
        raise ValueError(
            f"rope.scaling.sequence_length: {kind} scaling needs the sequence "
            f"length the engine scaled for at this step ({engines}); "
            "docs/PYTHON.md, \"RoPE\"")
    return int(n)


def _dynamic_scaling(s: Mapping, out: snapshot_pb2.RopeScaling) -> None:
    """Dynamic NTK: L is Hugging Face's max_position_embeddings (vLLM's
    max_trained_positions) unless given as original_max_position."""
    if not out.original_max_position:
        length = s.get("max_trained_positions", s.get("max_position_embeddings"))
        if length is None:
            raise ValueError(
                "rope.scaling.original_max_position: dynamic scaling needs the "
                "length it scales beyond: Hugging Face's max_position_embeddings "
                "(vLLM: max_trained_positions)")
        out.original_max_position = int(length)
    out.sequence_length = _sequence_length(
        s, "dynamic", "Hugging Face: the step's largest position + 1; vLLM: "
        "the model's max_position_embeddings")


def _longrope_scaling(s: Mapping, out: snapshot_pb2.RopeScaling) -> None:
    """LongRoPE (Phi-3): both factor lists; factor from
    max_position_embeddings as Hugging Face derives it when the config has
    none; vLLM's short_mscale / long_mscale as the attention factor of the
    list in use."""
    for k in ("short_factor", "long_factor"):
        if s.get(k) is None:
            raise ValueError(f"rope.scaling.{k}: longrope needs it "
                             "(rotary_dim / 2 numbers)")
        getattr(out, k).extend(float(x) for x in s[k])
    if not out.original_max_position:
        raise ValueError("rope.scaling.original_max_position: longrope needs "
                         "original_max_position_embeddings")
    out.sequence_length = _sequence_length(
        s, "longrope", "Hugging Face: the step's largest position + 1; vLLM: "
        "max_model_len")
    mscale = s.get("long_mscale" if out.sequence_length > out.original_max_position
                   else "short_mscale")
    if s.get("attention_factor") is None and mscale is not None:
        out.attention_factor = float(mscale)
    if s.get("factor") is None and not out.attention_factor:
        if s.get("max_position_embeddings") is None:
            raise ValueError(
                "rope.scaling.factor: longrope needs factor, or "
                "max_position_embeddings (Hugging Face's default attention "
                "factor uses max_position_embeddings / "
                "original_max_position_embeddings), or attention_factor")
        out.factor = float(s["max_position_embeddings"]) / out.original_max_position
