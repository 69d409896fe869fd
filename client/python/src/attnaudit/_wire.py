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

from typing import Any, Dict, Iterator, List, Sequence, Tuple

from attnaudit.v1 import service_pb2, snapshot_pb2, tensor_pb2

from . import _enums as E
from ._arrays import WireTensor

# Tensor paths of a Snapshot, in the order the contract lists them.
TENSOR_PATHS: Tuple[str, ...] = (
    "q", "k_pages", "v_pages", "k_scale", "v_scale", "page_ids", "block_table",
    "kv_seq_lens", "query_positions", "slot_positions", "key_rope_positions",
    "sinks", "cp.block_owners", "cp.rank_out", "cp.rank_lse", "engine.out",
    "engine.lse", "engine.logprobs", "selected_token_ids", "lm_head",
    "active_mask", "pre_rope.q", "pre_rope.k", "rope_table.inv_freq",
    "rope_table.positions", "rope_table.cos", "rope_table.sin")

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


def _number(descriptor: Any, name: str) -> int:
    return descriptor.fields_by_name[name].number


# Files: every tensor's data starts at a multiple of _ALIGN bytes from the
# start of the file, as the C++ writer does (proto/codec/aligned_writer.h),
# so that `attnaudit check` uses the bytes in place instead of copying them.
_ALIGN = 64
_PADDING = tensor_pb2.Tensor.DESCRIPTOR.fields_by_name["padding"].number


class _Filler(bytearray):
    """A Tensor.padding field before a tensor's data. Its partner after the
    data gets the rest of _ALIGN - 1 filler bytes, so the tensor's size does
    not depend on the split, which place_fillers sets from the offset."""

    def __init__(self, partner: bytearray, data_header: int):
        super().__init__(key(_PADDING) + varint(0))
        self.partner = partner
        self.data_header = data_header  # the data field's tag and length


def _padding(n: int) -> bytes:
    return key(_PADDING) + varint(n) + bytes(n)


def _tensor_message(t: WireTensor, with_data: bool, align: bool = False) -> List:
    """Pieces of one serialised attnaudit.v1.Tensor."""
    head = tensor_pb2.Tensor(dtype=E.wire(t.dtype), shape=list(t.shape)).SerializeToString()
    pieces: List = [head]
    if with_data and t.nbytes > 0:
        data_header = key(3) + varint(t.nbytes)
        if not align:
            return pieces + [data_header, t.data()]
        after = bytearray(_padding(_ALIGN - 1))
        pieces += [_Filler(after, len(data_header)), data_header, t.data(), after]
    return pieces


def place_fillers(pieces: List) -> None:
    """Splits each tensor's filler so that its data lands on an aligned
    offset of the joined pieces."""
    offset = 0
    for p in pieces:
        if isinstance(p, _Filler):
            start = offset + 2 + p.data_header
            before = (_ALIGN - start % _ALIGN) % _ALIGN
            p[:] = _padding(before)
            p.partner[:] = _padding(_ALIGN - 1 - before)
        offset += len(p) if isinstance(p, (bytes, bytearray)) else p.nbytes


def _size(pieces: Sequence) -> int:
    return sum(len(p) if isinstance(p, (bytes, bytearray)) else p.nbytes
               for p in pieces)


def _field(number: int, body: List) -> List:
    return [key(number) + varint(_size(body))] + body


def snapshot_pieces(meta: snapshot_pb2.Snapshot,
                    tensors: Dict[str, WireTensor],
                    with_data: Any = lambda path: True, align: bool = False) -> List:
    """Pieces of a serialised Snapshot: `meta` (which holds no tensor) plus
    the tensors. with_data(path) False writes a tensor's dtype and shape
    only (the AuditStream header). align: the layout of a file (each
    tensor's data on a multiple of 64 bytes from the first piece)."""
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
                       _tensor_message(t, with_data(path), align)))
        else:
            top += _field(_number(desc, name),
                          _tensor_message(t, with_data(path), align))
    if nested:
        base = snapshot_pb2.Snapshot()
        base.CopyFrom(meta)
        for parent, body in nested.items():
            sub = getattr(meta, parent).SerializeToString() if meta.HasField(parent) else b""
            base.ClearField(parent)
            top += _field(_number(desc, parent), [sub] + body)
        pieces = [base.SerializeToString()] + top
    else:
        pieces = [meta.SerializeToString()] + top
    if align:
        place_fillers(pieces)
    return pieces


def request_bytes(snapshot_field: int, pieces: List, rest: bytes) -> bytes:
    """A request message: `rest` (its other fields, serialised by the
    generated class) plus the snapshot as field `snapshot_field`, joined in
    one copy."""
    return b"".join([rest] + _field(snapshot_field, pieces))


def header_message(meta: snapshot_pb2.Snapshot, tensors: Dict[str, WireTensor],
                   streamed: Sequence[str], options: Any, priority: int) -> bytes:
    """The serialised AuditStreamMessage holding the header."""
    streamed_set = set(streamed)
    header = service_pb2.AuditStreamHeader(priority=E.wire(priority))
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
