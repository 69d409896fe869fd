"""Hand-assembled protobuf encodings of the requests that carry tensor bytes.

Why by hand: assigning hundreds of MiB to a protobuf bytes field copies them,
and serialising the message copies them again. Here a request is a list of
pieces -- small serialised messages and memoryviews of the tensors' own
buffers -- joined once into the bytes handed to gRPC. Only the tensor fields
are written by hand (tag, length, the Tensor message); every other field is
serialised by the generated classes, so the two can never disagree on the
rest of the contract. Protobuf parsers accept fields in any order, so the
hand-written tensor fields simply follow the generated ones.

Paths name Snapshot tensor fields as in StreamedTensor.field_path: "q",
"k_pages", ..., "cp.rank_out", "engine.lse".
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Sequence, Tuple

from attnaudit.v1 import service_pb2, snapshot_pb2, tensor_pb2

from ._arrays import WireTensor

# Tensor paths of a Snapshot, in the order the contract lists them.
TENSOR_PATHS: Tuple[str, ...] = (
    "q", "k_pages", "v_pages", "k_scale", "v_scale", "page_ids", "block_table",
    "kv_seq_lens", "query_positions", "slot_positions", "key_rope_positions",
    "sinks", "cp.block_owners", "cp.rank_out", "cp.rank_lse", "engine.out",
    "engine.lse", "engine.logprobs", "selected_token_ids", "lm_head",
    "active_mask")

_LEN = 2  # wire type of length-delimited fields


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field: int, wire_type: int = _LEN) -> bytes:
    return varint((field << 3) | wire_type)


def _number(descriptor, name: str) -> int:
    return descriptor.fields_by_name[name].number


def _tensor_message(t: WireTensor, with_data: bool) -> List:
    """Pieces of one serialised attnaudit.v1.Tensor."""
    head = tensor_pb2.Tensor(dtype=t.dtype, shape=list(t.shape)).SerializeToString()
    pieces: List = [head]
    if with_data and t.nbytes > 0:
        pieces += [key(3) + varint(t.nbytes), t.data()]
    return pieces


def _size(pieces: Sequence) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)


def _field(number: int, body: List) -> List:
    return [key(number) + varint(_size(body))] + body


def snapshot_pieces(meta: snapshot_pb2.Snapshot,
                    tensors: Dict[str, WireTensor],
                    with_data=lambda path: True) -> List:
    """Pieces of a serialised Snapshot: `meta` (which holds no tensor) plus
    the tensors. with_data(path) False writes a tensor's dtype and shape
    only (the AuditStream header)."""
    desc = snapshot_pb2.Snapshot.DESCRIPTOR
    top: List = []
    nested: Dict[str, List] = {}
    for path in TENSOR_PATHS:
        t = tensors.get(path)
        if t is None:
            continue
        parent, _, name = path.rpartition(".")
        if parent:
            sub_desc = desc.fields_by_name[parent].message_type
            nested.setdefault(parent, []).extend(
                _field(_number(sub_desc, name),
                       _tensor_message(t, with_data(path))))
        else:
            top += _field(_number(desc, name), _tensor_message(t, with_data(path)))
    if nested:
        base = snapshot_pb2.Snapshot()
        base.CopyFrom(meta)
        for parent, body in nested.items():
            sub = getattr(meta, parent).SerializeToString() if meta.HasField(parent) else b""
            base.ClearField(parent)
            top += _field(_number(desc, parent), [sub] + body)
        return [base.SerializeToString()] + top
    return [meta.SerializeToString()] + top


def request_bytes(snapshot_field: int, pieces: List, rest: bytes) -> bytes:
    """A request message: `rest` (its other fields, serialised by the
    generated class) plus the snapshot as field `snapshot_field`, joined in
    one copy."""
    return b"".join([rest] + _field(snapshot_field, pieces))


def header_message(meta: snapshot_pb2.Snapshot, tensors: Dict[str, WireTensor],
                   streamed: Sequence[str], options, priority: int) -> bytes:
    """The serialised AuditStreamMessage holding the header."""
    streamed_set = set(streamed)
    header = service_pb2.AuditStreamHeader(priority=priority)
    if options is not None:
        header.options.CopyFrom(options)
    for path in streamed:
        header.manifest.add(field_path=path, byte_length=tensors[path].nbytes)
    # The header's snapshot: inline tensors with data, streamed ones without.
    snap = snapshot_pieces(meta, tensors, lambda p: p not in streamed_set)
    body = [header.SerializeToString()] + _field(
        _number(service_pb2.AuditStreamHeader.DESCRIPTOR, "snapshot"), snap)
    return b"".join(_field(
        _number(service_pb2.AuditStreamMessage.DESCRIPTOR, "header"), body))


def chunk_messages(tensors: Dict[str, WireTensor], streamed: Sequence[str],
                   chunk_bytes: int) -> Iterator[bytes]:
    """Serialised AuditStreamMessage chunks carrying the streamed tensors'
    bytes in manifest order, `chunk_bytes` per chunk (the last may be
    shorter; a chunk may span tensors)."""
    chunk_field = _number(service_pb2.AuditStreamMessage.DESCRIPTOR, "chunk")
    pending: List = []
    filled = 0
    for path in streamed:
        view = tensors[path].data()
        offset = 0
        while offset < len(view):
            take = min(chunk_bytes - filled, len(view) - offset)
            pending.append(view[offset:offset + take])
            offset += take
            filled += take
            if filled == chunk_bytes:
                yield _chunk(chunk_field, pending, filled)
                pending, filled = [], 0
    if filled:
        yield _chunk(chunk_field, pending, filled)


def _chunk(chunk_field: int, pieces: List, n: int) -> bytes:
    inner = key(1) + varint(n)  # AuditStreamChunk.data
    return b"".join([key(chunk_field) + varint(len(inner) + n), inner] + pieces)
