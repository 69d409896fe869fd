"""Array plumbing: wire dtypes, owned byte buffers, numpy and torch inputs.

Everything the client sends is a WireTensor: a wire dtype code
(attnaudit.v1.DType), a shape and a buffer of little-endian bytes that the
client owns. Inputs arrive as numpy arrays (bf16/fp8 through ml_dtypes), torch
tensors (CPU or CUDA) or Python scalars/lists. torch is never imported here:
a torch tensor is recognised by its type's module, and the torch module is
taken from sys.modules (it is necessarily loaded when such a tensor exists).

CUDA tensors are copied asynchronously: into a device staging buffer on the
current stream (the gather), then into pinned host memory (non_blocking), and
the WireTensor is "pending" until WireTensor.wait() (or data()) synchronises
on the recorded event. The caller's thread never waits for the GPU here.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

# attnaudit.v1.DType numbers (part of the wire contract, never renumbered).
F32, F16, BF16, FP8_E4M3, FP8_E5M2, F64, I32, I64, BOOL = range(1, 10)

ITEMSIZE = {F32: 4, F16: 2, BF16: 2, FP8_E4M3: 1, FP8_E5M2: 1, F64: 8,
            I32: 4, I64: 8, BOOL: 1}
NAMES = {F32: "f32", F16: "f16", BF16: "bf16", FP8_E4M3: "fp8_e4m3",
         FP8_E5M2: "fp8_e5m2", F64: "f64", I32: "i32", I64: "i64", BOOL: "bool"}
FLOATING = frozenset({F32, F16, BF16, FP8_E4M3, FP8_E5M2, F64})
INTEGER = frozenset({I32, I64})

_ALIASES = {"f32": F32, "float32": F32, "fp32": F32, "float": F32,
            "f16": F16, "float16": F16, "fp16": F16, "half": F16,
            "bf16": BF16, "bfloat16": BF16,
            "fp8_e4m3": FP8_E4M3, "float8_e4m3fn": FP8_E4M3, "e4m3": FP8_E4M3,
            "fp8_e5m2": FP8_E5M2, "float8_e5m2": FP8_E5M2, "e5m2": FP8_E5M2,
            "f64": F64, "float64": F64, "fp64": F64, "double": F64,
            "i32": I32, "int32": I32, "i64": I64, "int64": I64, "bool": BOOL}


def _ml_dtypes() -> Any:
    import ml_dtypes  # a dependency; imported on first bf16/fp8 use
    return ml_dtypes


def numpy_dtype(code: int) -> np.dtype:
    """The numpy dtype holding wire dtype `code` (ml_dtypes for bf16/fp8)."""
    if code == F32:
        return np.dtype(np.float32)
    if code == F16:
        return np.dtype(np.float16)
    if code == F64:
        return np.dtype(np.float64)
    if code == I32:
        return np.dtype("<i4")
    if code == I64:
        return np.dtype("<i8")
    if code == BOOL:
        return np.dtype(np.bool_)
    ml = _ml_dtypes()
    if code == BF16:
        return np.dtype(ml.bfloat16)
    if code == FP8_E4M3:
        return np.dtype(ml.float8_e4m3fn)
    if code == FP8_E5M2:
        return np.dtype(ml.float8_e5m2)
    raise ValueError(f"unknown wire dtype {code}")


def _numpy_code(dtype: np.dtype) -> Optional[int]:
    if dtype == np.float32:
        return F32
    if dtype == np.float16:
        return F16
    if dtype == np.float64:
        return F64
    if dtype == np.int32:
        return I32
    if dtype == np.int64:
        return I64
    if dtype == np.bool_:
        return BOOL
    name = dtype.name
    if name == "bfloat16":
        return BF16
    if name == "float8_e4m3fn":
        return FP8_E4M3
    if name == "float8_e5m2":
        return FP8_E5M2
    return None


def _torch_code(dtype: Any) -> Optional[int]:
    name = str(dtype).rpartition(".")[2]
    return {"float32": F32, "float16": F16, "bfloat16": BF16,
            "float8_e4m3fn": FP8_E4M3, "float8_e5m2": FP8_E5M2,
            "float64": F64, "int32": I32, "int64": I64, "bool": BOOL}.get(name)


def dtype_code(value: Any, what: str) -> int:
    """Wire dtype of a dtype spelled as a name, a numpy/torch dtype or a code."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in ITEMSIZE:
            return int(value)
    elif isinstance(value, str):
        code = _ALIASES.get(value.lower().removeprefix("dtype_"))
        if code is not None:
            return code
    elif is_torch(value) or type(value).__module__ == "torch":
        code = _torch_code(value)
        if code is not None:
            return code
    else:
        try:
            code = _numpy_code(np.dtype(value))
        except TypeError:
            code = None
        if code is not None:
            return code
    raise TypeError(f"{what}: unsupported dtype {value!r}; use one of "
                    + ", ".join(NAMES.values()))


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "is_cuda")


def is_cuda(x: Any) -> bool:
    return is_torch(x) and bool(x.is_cuda)


def _torch() -> Any:
    return sys.modules["torch"]


def code_of(x: Any, what: str) -> int:
    """Wire dtype of an array or tensor; TypeError naming `what` otherwise."""
    if is_torch(x):
        code = _torch_code(x.dtype)
        shown = x.dtype
    else:
        code = _numpy_code(x.dtype)
        shown = x.dtype
    if code is None:
        raise TypeError(f"{what}: dtype {shown} has no attnaudit wire type; "
                        "use " + ", ".join(NAMES.values()))
    return code


def as_array(x: Any, what: str) -> Any:
    """x itself when it is a numpy array or torch tensor, else np.asarray(x)."""
    if isinstance(x, np.ndarray) or is_torch(x):
        return x
    try:
        return np.asarray(x)
    except Exception as e:  # noqa: BLE001 - reported with the argument name
        raise TypeError(f"{what}: cannot be read as an array: {e}") from None


def host_numpy(x: Any, what: str) -> np.ndarray:
    """A host numpy view/copy of small metadata (block tables, lengths).

    A CUDA tensor is copied synchronously: pass the engine's host copies of
    its tables (vLLM and SGLang keep them) to keep the caller non-blocking.
    """
    x = as_array(x, what)
    if is_torch(x):
        t = x.detach()
        if t.is_cuda:
            _warn_cuda_sync(what)
            t = t.cpu()
        if _torch_code(t.dtype) in (BF16, FP8_E4M3, FP8_E5M2):
            return t.float().numpy()
        return t.numpy()
    return x


_warned: set = set()


def _warn_cuda_sync(what: str) -> None:
    if what in _warned:
        return
    _warned.add(what)
    import warnings
    warnings.warn(f"attnaudit: {what} is a CUDA tensor; reading it synchronises "
                  "with the GPU. Pass the engine's host copy to stay non-blocking.",
                  RuntimeWarning, stacklevel=4)


class _Pending:
    """Outstanding asynchronous device-to-host copies of one snapshot."""

    __slots__ = ("event", "keepalive", "lock")

    def __init__(self, event: Any, keepalive: Any) -> None:
        self.event = event
        self.keepalive = keepalive
        self.lock = threading.Lock()

    def wait(self) -> None:
        with self.lock:
            if self.event is not None:
                self.event.synchronize()
                self.event = None
                self.keepalive = None


class WireTensor:
    """A tensor as it goes on the wire: dtype code, shape, owned bytes.

    `buf` is a 1-D contiguous uint8 numpy array (possibly viewing a pinned
    torch tensor) that nobody else writes. Thread safety: immutable once
    ready; wait() may be called from any thread.
    """

    __slots__ = ("dtype", "shape", "_buf", "_pending")

    def __init__(self, dtype: int, shape: Sequence[int], buf: Any, pending: Any = None) -> None:
        self.dtype = int(dtype)
        self.shape = tuple(int(d) for d in shape)
        self._buf = buf
        self._pending = pending

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n

    def wait(self) -> None:
        if self._pending is not None:
            self._pending.wait()
            self._pending = None

    def data(self) -> memoryview:
        """The bytes (waits for a pending device copy first)."""
        self.wait()
        buf = self._buf
        if not isinstance(buf, np.ndarray):  # a pinned torch tensor
            buf = buf.numpy()
            self._buf = buf
        return memoryview(buf).cast("B")

    def array(self) -> np.ndarray:
        """A typed read-only numpy view of the bytes (no copy)."""
        a = np.frombuffer(self.data(), dtype=numpy_dtype(self.dtype))
        return a.reshape(self.shape)

    @staticmethod
    def from_bytes(dtype: int, shape: Sequence[int], data: bytes) -> "WireTensor":
        buf = np.frombuffer(data, dtype=np.uint8)
        return WireTensor(dtype, shape, buf)


def _numpy_bytes(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.reshape(-1).view(np.uint8)


class CopyPlan:
    """Collects the copies of one snapshot build and finishes them together.

    Host inputs are copied at once (one copy each). CUDA inputs are first
    gathered/copied on the device on the current stream; finish() then
    records the "gathered" event (all reads of the engine's memory are done:
    the engine's stream may wait on it), starts the device-to-host copies
    into pinned memory and records the event the pending tensors wait on.
    """

    def __init__(self) -> None:
        self._device: List[Tuple[WireTensor, Any]] = []  # (WireTensor, device staging tensor)
        self.gathered_event: Any = None

    # -- host and device copies ------------------------------------------

    def own(self, x: Any, what: str, code: Optional[int] = None,
            copy: bool = True) -> WireTensor:
        """A WireTensor with its own copy of x (converted to `code` if given).

        copy=False: x is a fresh array nobody else holds (e.g. the result of a
        gather), kept without another copy.
        """
        x = as_array(x, what)
        if is_torch(x):
            return self._own_torch(x, what, code, copy)
        src_code = code_of(x, what)
        if code is not None and code != src_code:
            a = x.astype(numpy_dtype(code), order="C")
        elif copy or not x.flags.c_contiguous:
            a = np.array(x, order="C", copy=True)
        else:
            a = x
        return WireTensor(code or src_code, a.shape, _numpy_bytes(a))

    def _own_torch(self, t: Any, what: Any, code: Any, copy: Any) -> WireTensor:
        torch = _torch()
        t = t.detach()
        src_code = code_of(t, what)
        if code is not None and code != src_code:
            t = t.to(_torch_dtype(code))  # a new tensor: the one copy
            copy = False
        if t.is_cuda:
            staged = t.contiguous() if not copy else t.clone(
                memory_format=torch.contiguous_format)
            # The engine's tensor is read on this (possibly side) stream:
            # keep its memory from being reused before the read is done.
            t.record_stream(torch.cuda.current_stream(t.device))
            return self._stage_device(staged, code or src_code)
        a = _numpy_view(t)
        if copy or not a.flags.c_contiguous:
            a = np.array(a, order="C", copy=True)
        return WireTensor(code or src_code, a.shape, _numpy_bytes(a))

    def take_pages(self, pool: Any, ids: np.ndarray, what: str) -> WireTensor:
        """pool[ids] along axis 0, as one gather copy (pool may be a strided
        view, e.g. one half of a fused K/V cache)."""
        if is_torch(pool):
            torch = _torch()
            code = code_of(pool, what)
            if code in (FP8_E4M3, FP8_E5M2):
                pool = pool.view(torch.uint8)  # index kernels may lack fp8
            if pool.is_cuda:
                idx = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))
                idx = idx.pin_memory().to(pool.device, non_blocking=True)
                staged = pool.detach().index_select(0, idx)
                return self._stage_device(staged, code)
            # Host tensors are gathered by numpy through a zero-copy view:
            # numpy backs large fresh arrays with transparent huge pages,
            # which makes the gather ~4x faster than torch's (whose fresh
            # buffers pay a page fault per 4 KiB).
            pool = _numpy_view(pool.detach())
        else:
            code = code_of(pool, what)
        # Fancy indexing, not np.take: on a strided view (half of a fused
        # cache) np.take first copies the whole pool to a contiguous array.
        out = pool[np.asarray(ids, dtype=np.intp)]  # fresh, C-contiguous
        return WireTensor(code, out.shape, _numpy_bytes(out))

    def _stage_device(self, staged: Any, code: int) -> WireTensor:
        wt = WireTensor(code, tuple(staged.shape), None)
        self._device.append((wt, staged))
        return wt

    def finish(self) -> None:
        """Starts the device-to-host copies (no wait)."""
        if not self._device:
            return
        torch = _torch()
        stream = torch.cuda.current_stream(self._device[0][1].device)
        self.gathered_event = torch.cuda.Event()
        self.gathered_event.record(stream)
        keep = []
        for wt, staged in self._device:
            host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
            host.copy_(staged, non_blocking=True)
            wt._buf = host.reshape(-1).view(torch.uint8)
            keep.append(staged)
        done = torch.cuda.Event()
        done.record(stream)
        pending = _Pending(done, keep)
        for wt, _ in self._device:
            wt._pending = pending
        self._device = []


def _numpy_view(t: Any) -> np.ndarray:
    """A zero-copy numpy view of a host torch tensor's storage (strides
    kept), as unsigned integers of the element's size: numpy has no bf16 or
    fp8 of torch's, and only the bytes matter from here on."""
    torch = _torch()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(as_int[t.element_size()]).numpy()


def _torch_dtype(code: int) -> Any:
    torch = _torch()
    return {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16,
            F64: torch.float64, I32: torch.int32, I64: torch.int64,
            BOOL: torch.bool, FP8_E4M3: getattr(torch, "float8_e4m3fn", None),
            FP8_E5M2: getattr(torch, "float8_e5m2", None)}[code]


def int_tensor(values: np.ndarray) -> WireTensor:
    """Index data as i32 when every value fits, else i64."""
    a = np.asarray(values, dtype=np.int64)
    if a.size == 0 or (a.min() >= -(2**31) and a.max() < 2**31):
        a = a.astype("<i4")
        return WireTensor(I32, a.shape, _numpy_bytes(a))
    return WireTensor(I64, a.shape, _numpy_bytes(a.astype("<i8")))
