"""A snapshot handed to a server on the same machine in shared memory.

    with attnaudit.MemfdSnapshot(snap) as m:
        report = client.audit_memfd(m)      # the server reads it in place
        m.write(next_snap)                  # after the answer: reuse it
        report = client.audit_memfd(m)

The snapshot is encoded (as a snapshot file) into a memfd sealed against
shrinking, and the request names it as /proc/<pid>/fd/<fd>: a server
started with --accept-memfd-snapshots maps it and audits the tensors in
place, so none of its bytes cross a socket; one memfd rewritten per audit
stays mapped in the server (docs/OPERATIONS.md, "Snapshots in shared
memory"). Linux only. Do not write() while an audit of it runs.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any

from .snapshot import Snapshot
from .v1 import service_pb2

_MAX_BYTES = (1 << 31) - 1  # one protobuf message


class MemfdSnapshot:
    """Owns one memfd (closed by close() or the with-block)."""

    def __init__(self, snapshot: Snapshot):
        self._fd = os.memfd_create("attnaudit-snapshot",
                                   os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._size = 0   # of the memfd
        self.nbytes = 0  # of the snapshot now in it
        try:
            # What the server checks to be sure it opened this very memfd.
            self._inode = os.fstat(self._fd).st_ino
            with open("/proc/sys/kernel/random/boot_id") as f:
                self._boot_id = f.read().strip()
            self.write(snapshot)
            # A memfd that could shrink under the server's mapping would
            # fault the server, so it refuses memfds without this seal.
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        except BaseException:
            self.close()  # once: __del__ will find it closed
            raise

    def write(self, snapshot: Snapshot) -> None:
        """Replaces the content with `snapshot` (the memfd grows if needed)."""
        snapshot.wait()
        pieces = snapshot.file_pieces()
        size = sum(len(p) if isinstance(p, (bytes, bytearray)) else p.nbytes
                   for p in pieces)
        if size > _MAX_BYTES:
            raise ValueError(f"the snapshot encodes to {size} bytes, over the "
                             "2 GiB limit of one message")
        if size > self._size:
            os.ftruncate(self._fd, size)
            self._size = size
        with mmap.mmap(self._fd, size) as m:
            offset = 0
            for p in pieces:
                view = memoryview(p).cast("B")
                m[offset:offset + len(view)] = view
                offset += len(view)
        self.nbytes = size

    def describe(self) -> service_pb2.MemfdSnapshot:
        """AuditRequest.snapshot_memfd for this memfd."""
        return service_pb2.MemfdSnapshot(
            path=f"/proc/{os.getpid()}/fd/{self._fd}", bytes=self.nbytes,
            boot_id=self._boot_id, inode=self._inode)

    def close(self) -> None:
        if getattr(self, "_fd", -1) >= 0:  # absent when memfd_create failed
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "MemfdSnapshot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
