"""Reads an attnaudit.v1.Snapshot file into numpy arrays for the peers.

The message classes are generated from proto/attnaudit/v1/*.proto into the
benchmark's venv when it is set up (`make bench-env`, grpcio-tools' protoc);
nothing here is hand-written wire parsing. A snapshot file is one binary
Snapshot message (proto/codec/file_codec.cc writes it).

Also here: the queries' RoPE as an engine computes it (and as attnaudit
does, core/rope): inverse frequencies, angles, cos/sin and the rotation in
fp32, one cast to the output dtype after. The peers apply it themselves, as
a user of the snapshot would; the benchmark checks the result against the
post-RoPE queries attnaudit used.

Supported by the peers: the plain decode attention the W1 and sweep
snapshots use (bf16/f16/f32 KV, NHD or HND pages, pre- or post-RoPE q with
no/linear/llama3 scaling, post-RoPE K). Anything else (fp8 KV, a pre-RoPE
cache, sliding windows, soft-caps, sinks, YaRN, context parallelism) raises
Unsupported rather than computing something else.
"""

import math
from dataclasses import dataclass

import numpy as np
from attnaudit.v1 import snapshot_pb2, tensor_pb2


class Unsupported(Exception):
    pass


T = tensor_pb2
# Raw element types: 16-bit floats stay as their bits until widened.
_RAW = {T.DTYPE_F32: "<f4", T.DTYPE_F16: "<u2", T.DTYPE_BF16: "<u2",
        T.DTYPE_F64: "<f8", T.DTYPE_I32: "<i4", T.DTYPE_I64: "<i8",
        T.DTYPE_BOOL: "u1", T.DTYPE_FP8_E4M3: "u1", T.DTYPE_FP8_E5M2: "u1"}


@dataclass
class Array:
    dtype: int       # tensor_pb2.DType
    data: np.ndarray  # raw elements, shaped (a view of the message's bytes)


def _array(t):
    if t.dtype not in _RAW:
        raise Unsupported(f"tensor dtype {t.dtype}")
    data = np.frombuffer(t.data, dtype=_RAW[t.dtype])
    return Array(t.dtype, data.reshape(tuple(t.shape)))


def widen(dtype, raw, to=np.float32):
    """Raw elements of `dtype` as `to` (bf16/f16 widen exactly)."""
    if dtype == T.DTYPE_BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(
            to, copy=False)
    if dtype == T.DTYPE_F16:
        return raw.view(np.float16).astype(to)
    if dtype in (T.DTYPE_F32, T.DTYPE_F64):
        return raw.astype(to)
    raise Unsupported(f"floating dtype {dtype}")


def round_to(x, dtype):
    """float32 array rounded to `dtype` (round to nearest even), as float32."""
    if dtype == T.DTYPE_BF16:
        u = x.astype(np.float32).view(np.uint32)
        u = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & \
            np.uint32(0xFFFF0000)
        return u.view(np.float32)
    if dtype == T.DTYPE_F16:
        return x.astype(np.float16).astype(np.float32)
    if dtype in (T.DTYPE_F32, T.DTYPE_F64):
        return x.astype(np.float32)
    raise Unsupported(f"RoPE output dtype {dtype}")


@dataclass
class Snapshot:
    q: Array               # [B, Sq, Hq, D]
    k_pages: Array         # [N, P, Hkv, D] (NHD) or [N, Hkv, P, D] (HND)
    v_pages: Array
    hnd: bool
    block_table: np.ndarray      # [B, M] int64
    seq_lens: np.ndarray         # [B] int64
    query_positions: np.ndarray  # [B, Sq] int64
    slot_positions: np.ndarray   # [N, P] int64
    scale: float
    msg: snapshot_pb2.Snapshot

    @property
    def dims(self):
        b, sq, hq, d = self.q.data.shape
        hkv = self.k_pages.data.shape[1 if self.hnd else 2]
        page = self.slot_positions.shape[1]
        return b, sq, hq, hkv, d, page


def _ints(t):
    return _array(t).data.astype(np.int64)


def read(path):
    """Parses the file; raises Unsupported for what the peers cannot do."""
    msg = snapshot_pb2.Snapshot()
    with open(path, "rb") as f:
        msg.ParseFromString(f.read())
    if msg.k_pages.dtype not in (T.DTYPE_BF16, T.DTYPE_F16, T.DTYPE_F32):
        raise Unsupported("KV dtype other than bf16/f16/f32")
    if msg.rope.k_state == snapshot_pb2.ROPE_STATE_PRE_ROPE:
        raise Unsupported("pre-RoPE K cache")
    if (msg.sliding_window or msg.logit_softcap or msg.HasField("sinks") or
            (msg.HasField("cp") and msg.cp.world_size > 1)):
        raise Unsupported("window, soft-cap, sinks or context parallelism")
    q = _array(msg.q)
    d = q.data.shape[3]
    return Snapshot(
        q=q, k_pages=_array(msg.k_pages), v_pages=_array(msg.v_pages),
        hnd=msg.kv_layout == snapshot_pb2.KV_LAYOUT_HND,
        block_table=_ints(msg.block_table), seq_lens=_ints(msg.kv_seq_lens),
        query_positions=_ints(msg.query_positions),
        slot_positions=_ints(msg.slot_positions),
        scale=msg.softmax_scale or 1.0 / math.sqrt(d), msg=msg)


def _inv_freq(rope, rotary_dim):
    """fp32 inverse frequencies with the configured scaling (core/rope)."""
    f32 = np.float32
    base = f32(rope.theta or 10000.0)
    inv = [f32(1.0) / (base ** (f32(2 * i) / f32(rotary_dim)))
           for i in range(rotary_dim // 2)]
    s = rope.scaling
    if s.type == snapshot_pb2.ROPE_SCALING_TYPE_LINEAR:
        inv = [f / f32(s.factor or 1.0) for f in inv]
    elif s.type == snapshot_pb2.ROPE_SCALING_TYPE_LLAMA3:
        factor, low = f32(s.factor or 1.0), f32(s.low_freq_factor or 1.0)
        high = f32(s.high_freq_factor or 4.0)
        old_len = f32(s.original_max_position or 8192)
        low_wl, high_wl = old_len / low, old_len / high
        pi = f32(math.pi)
        out = []
        for f in inv:
            wavelen = f32(2.0) * pi / f
            if wavelen < high_wl:
                out.append(f)
            elif wavelen > low_wl:
                out.append(f / factor)
            else:
                smooth = (old_len / wavelen - low) / (high - low)
                out.append((f32(1.0) - smooth) * f / factor + smooth * f)
        inv = out
    elif s.type != snapshot_pb2.ROPE_SCALING_TYPE_NONE:
        raise Unsupported("RoPE scaling other than none/linear/llama3")
    return np.array(inv, dtype=np.float32)


def rope_queries(snap):
    """Post-RoPE queries [B, Sq, Hq, D] as float64 (values of the RoPE
    output dtype), computed as an engine does."""
    msg = snap.msg
    q = widen(snap.q.dtype, snap.q.data)
    if msg.rope.q_state != snapshot_pb2.ROPE_STATE_PRE_ROPE:
        return q.astype(np.float64)
    b, sq, hq, d, = q.shape
    rotary = msg.rope.rotary_dim or d
    half = rotary // 2
    inv = _inv_freq(msg.rope, rotary)
    # cos/sin in float64 rounded once to float32: the correctly rounded
    # fp32 value, which is what libm's cosf/sinf return.
    angles = snap.query_positions.astype(np.float32)[..., None] * inv
    cos = np.cos(angles.astype(np.float64)).astype(np.float32)[:, :, None, :]
    sin = np.sin(angles.astype(np.float64)).astype(np.float32)[:, :, None, :]
    x = q.copy()
    if msg.rope.style == snapshot_pb2.ROPE_STYLE_GPTJ:
        x1, x2 = q[..., 0:rotary:2], q[..., 1:rotary:2]
        x[..., 0:rotary:2] = x1 * cos - x2 * sin
        x[..., 1:rotary:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = q[..., :half], q[..., half:rotary]
        x[..., :half] = x1 * cos - x2 * sin
        x[..., half:rotary] = x2 * cos + x1 * sin
    out_dtype = msg.rope.q_output_dtype or msg.q.dtype
    return round_to(x, out_dtype).astype(np.float64)


def row_pages(snap, b):
    """Page indices (into the pool) of row b's logical blocks, in order."""
    page = snap.slot_positions.shape[1]
    blocks = -(-int(snap.seq_lens[b]) // page)
    return snap.block_table[b, :blocks]


def gather_row(snap, pool, b):
    """Row b's cached tokens gathered from the page pool in logical order:
    raw elements [Hkv, L, D] (the page copy is the gather)."""
    pages = row_pages(snap, b)
    length = int(snap.seq_lens[b])
    data = pool.data[pages]
    if snap.hnd:  # [n, Hkv, P, D]
        n, hkv, p, d = data.shape
        return data.transpose(1, 0, 2, 3).reshape(hkv, n * p, d)[:, :length]
    n, p, hkv, d = data.shape  # [n, P, Hkv, D]
    return data.reshape(n * p, hkv, d)[:length].transpose(1, 0, 2)


def row_positions(snap, b):
    """Global positions [L] of row b's cached tokens in logical order."""
    pages = row_pages(snap, b)
    return snap.slot_positions[pages].reshape(-1)[:int(snap.seq_lens[b])]
