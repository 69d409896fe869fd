"""attnaudit's v1 KV fingerprints, computed on the client.

An engine that caches a prefix computes its fingerprint once (say at
prefill) and declares it on later decode steps (prefix_fingerprint=...); the
server recomputes it over what the step actually read and rejects a mismatch
(a corrupted or misplaced prefix page). prefix_fingerprint="auto" in the
builders computes it from the snapshot itself, which checks the engine's
prefix bookkeeping (key, length) but not the cache content.

The byte stream is the one docs/FINGERPRINTS.md specifies (header
line, then per row a line and fixed-size token records), written here from
that specification, independently of the server's implementation.
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from attnaudit.v1 import snapshot_pb2

from . import _arrays as A

if TYPE_CHECKING:  # pragma: no cover
    from .snapshot import Snapshot

VERSION = "attnaudit.kv.v1"


def prefix_fingerprint(snapshot: "Snapshot", length: int, key: str) -> str:
    """The v1 prefix digest over the first `length` tokens of every row."""
    lens = snapshot.tensor("kv_seq_lens").astype(np.int64)
    if (lens < length).any():
        b = int(np.argmax(lens < length))
        raise ValueError(f"prefix.length: {length} tokens exceed kv_seq_lens[{b}]"
                         f"={int(lens[b])}")
    return _digest(snapshot, "prefix", [int(length)] * len(lens), key)


def kv_cache_fingerprint(snapshot: "Snapshot") -> str:
    """The v1 digest of the whole logical KV (Provenance.kv_fingerprint)."""
    lens = snapshot.tensor("kv_seq_lens").astype(np.int64)
    return _digest(snapshot, "kv_cache", [int(n) for n in lens], None)


def _g17(x: float) -> str:
    return "%.17g" % x


def _or(x, default):
    return x if x else default


def _scaling_text(s: snapshot_pb2.RopeScaling) -> str:
    t = s.type
    if t == snapshot_pb2.ROPE_SCALING_TYPE_NONE:
        return "none"
    factor = _g17(_or(s.factor, 1.0))
    omp = _or(s.original_max_position, 8192)
    if t == snapshot_pb2.ROPE_SCALING_TYPE_LINEAR:
        return f"linear(factor={factor})"
    if t == snapshot_pb2.ROPE_SCALING_TYPE_LLAMA3:
        return (f"llama3(factor={factor},low_freq_factor={_g17(_or(s.low_freq_factor, 1.0))}"
                f",high_freq_factor={_g17(_or(s.high_freq_factor, 4.0))}"
                f",original_max_position={omp})")
    if t == snapshot_pb2.ROPE_SCALING_TYPE_YARN:
        # A truncating YaRN (the default) keeps the text it had before the
        # flag existed; only no_truncate adds to it.
        return (f"yarn(factor={factor},original_max_position={omp}"
                f",beta_fast={_g17(_or(s.beta_fast, 32.0))},beta_slow={_g17(_or(s.beta_slow, 1.0))}"
                f",attention_factor={_g17(s.attention_factor)}"
                f"{',truncate=false' if s.no_truncate else ''})")
    # The step's sequence_length is not bound here (a prefix must hash the
    # same at every step while the engine rescales as the sequence grows).
    if t == snapshot_pb2.ROPE_SCALING_TYPE_DYNAMIC:
        return f"dynamic(factor={factor},original_max_position={omp})"
    if t == snapshot_pb2.ROPE_SCALING_TYPE_LONGROPE:
        short = ",".join(_g17(x) for x in s.short_factor)
        long_ = ",".join(_g17(x) for x in s.long_factor)
        return (f"longrope(factor={factor},original_max_position={omp}"
                f",attention_factor={_g17(s.attention_factor)}"
                f",short_factor=[{short}],long_factor=[{long_}])")
    # A type this module does not know has no text yet: hashing it as another
    # type's would give a digest the server refuses (docs/EXTENDING.md).
    raise ValueError(f"rope.scaling.type: no fingerprint text for {t}")


# The cast point's name in the stream (unspecified means after_rope).
_CAST_NAMES = {
    snapshot_pb2.ROPE_CAST_POINT_UNSPECIFIED: "after_rope",
    snapshot_pb2.ROPE_CAST_POINT_AFTER_ROPE: "after_rope",
    snapshot_pb2.ROPE_CAST_POINT_COS_SIN: "cos_sin",
    snapshot_pb2.ROPE_CAST_POINT_EACH_OP: "each_op",
}


def _scale_text(snapshot, path: str, kv_dtype: int, heads: int) -> str:
    fp8 = kv_dtype in (A.FP8_E4M3, A.FP8_E5M2)
    if path not in snapshot.tensor_paths():
        return ",".join(["3f800000"] * heads) if fp8 else "none"
    s = snapshot.tensor(path).astype(np.float32).reshape(-1)
    vals = [s[0] if s.size == 1 else s[h] for h in range(heads)]
    return ",".join("%08x" % struct.unpack("<I", struct.pack("<f", float(v)))[0]
                    for v in vals)


def _header(snapshot, domain: str, key: Optional[str]) -> bytes:
    meta = snapshot.meta
    d = snapshot.dims
    k = snapshot.wire_tensor("k_pages")
    v = snapshot.wire_tensor("v_pages")
    rope = meta.rope
    k_state = "pre_rope" if rope.k_state == snapshot_pb2.ROPE_STATE_PRE_ROPE else "post_rope"
    style = "gptj" if rope.style == snapshot_pb2.ROPE_STYLE_GPTJ else "neox"
    k_out = rope.k_output_dtype or k.dtype
    text = (f"{VERSION};domain={domain};page_size={d['P']};kv_heads={d['Hkv']};"
            f"head_dim={d['D']};k_dtype={A.NAMES[k.dtype]};v_dtype={A.NAMES[v.dtype]};"
            f"k_scale={_scale_text(snapshot, 'k_scale', k.dtype, d['Hkv'])};"
            f"v_scale={_scale_text(snapshot, 'v_scale', v.dtype, d['Hkv'])};"
            f"k_rope_state={k_state};rope_style={style};"
            f"rope_theta={_g17(_or(rope.theta, 10000.0))};"
            f"rotary_dim={_or(rope.rotary_dim, d['D'])};"
            f"rope_scaling={_scaling_text(rope.scaling)};"
            f"rope_cast_at={_CAST_NAMES[rope.cast_point]};"
            f"k_rope_output_dtype={A.NAMES[k_out]}").encode()
    if key is not None:
        raw = key.encode()
        text += f";prefix_key={len(raw)}:".encode() + raw
    return text + b"\n"


def _block_pages(snapshot) -> np.ndarray:
    table = snapshot.tensor("block_table").astype(np.int64)
    if "page_ids" not in snapshot.tensor_paths():
        return table
    ids = snapshot.tensor("page_ids").astype(np.int64)
    order = np.argsort(ids)
    pos = np.searchsorted(ids[order], table)
    pos = np.minimum(pos, len(ids) - 1)
    return np.where(table >= 0, order[pos], -1)


def _digest(snapshot, domain: str, tokens: Sequence[int], key: Optional[str]) -> str:
    h = hashlib.sha256(_header(snapshot, domain, key))
    d = snapshot.dims
    P = d["P"]
    hnd = snapshot.meta.kv_layout == snapshot_pb2.KV_LAYOUT_HND
    k = snapshot.tensor("k_pages")
    v = snapshot.tensor("v_pages")
    slot_pos = snapshot.tensor("slot_positions").astype("<i8")
    paths = snapshot.tensor_paths()
    key_pos = (snapshot.tensor("key_rope_positions").astype("<i8")
               if "key_rope_positions" in paths else slot_pos)
    pages_of = _block_pages(snapshot)
    for b, n in enumerate(tokens):
        h.update(f"row={b};tokens={n}\n".encode())
        if n == 0:
            continue
        t = np.arange(n)
        pages = pages_of[b, t // P]
        slots = t % P
        if hnd:
            kt, vt = k[pages, :, slots], v[pages, :, slots]
        else:
            kt, vt = k[pages, slots], v[pages, slots]
        record = np.concatenate([
            slot_pos[pages, slots].reshape(n, 1).view(np.uint8),
            key_pos[pages, slots].reshape(n, 1).view(np.uint8),
            np.ascontiguousarray(kt).reshape(n, -1).view(np.uint8),
            np.ascontiguousarray(vt).reshape(n, -1).view(np.uint8)], axis=1)
        h.update(record.tobytes())
    return h.hexdigest()
