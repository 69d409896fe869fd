"""Which weight version each KV-cache block was written under.

RL loops update the rollout engine's weights between steps. A prefix cache
that is not reset then hands a new request blocks whose K/V the old
weights computed: the engine's attention is right about what it reads, and
its audits PASS, but what it reads is stale. PrefixVersions stamps every
block the engine writes with the current weight version (the training
loop's set_rl_step) and, for an audited row, counts the prefix blocks
written before the latest change of version.

Cost: nothing until a weight version is set; then, per engine step, one
scatter of the step's slot numbers into a [num_blocks] tensor on the
cache's device (asynchronous on a GPU), and on audited rows one gather.

Tensors are torch's (vLLM's) or numpy arrays (the tests'), as the cache is.
Not thread-safe: the engine's thread calls it (the plugin's hooks).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np


class PrefixVersions:
    """See the module docstring. Versions are counted: index 0 is before
    the first set_version, each change adds one; a block is stale once the
    version changed after it was written, from the second version on (the
    first one starts the record: what came before it is unknown)."""

    def __init__(self) -> None:
        self.version: Optional[Any] = None
        self.index = 0
        self.block_size = 0
        self._written: Any = None  # torch int32 [num_blocks + 1]; the last: padding

    def learn_cache(self, kv_cache: Any, backend: str) -> None:
        """The cache's block size and block count, from a layer's cache
        (vLLM's CPU layout [blocks, Hkv, block, 2 D]; FlashAttention's and
        FlashInfer's [2, blocks, block, Hkv, D] or [blocks, 2, ...])."""
        shape = tuple(int(x) for x in kv_cache.shape)
        if backend == "cpu_attn":
            blocks, size = shape[0], shape[2]
        elif shape[0] == 2:
            blocks, size = shape[1], shape[2]
        else:
            blocks, size = shape[0], shape[2]
        self.block_size = size
        if isinstance(kv_cache, np.ndarray):
            self._written = np.zeros(blocks + 1, dtype=np.int32)
        else:
            import torch
            self._written = torch.zeros(blocks + 1, dtype=torch.int32,
                                        device=kv_cache.device)

    def set_version(self, version: Any) -> bool:
        """The weights now in use; True when they changed."""
        if version == self.version:
            return False
        self.version = version
        self.index += 1
        return True

    @property
    def active(self) -> bool:
        return self.index >= 1 and self._written is not None

    def stamp(self, slot_mapping: Any, tokens: Optional[int] = None) -> None:
        """The blocks this step writes (slot_mapping: one cache slot per
        token, negative for padding) are now of the current version."""
        slots = slot_mapping if tokens is None else slot_mapping[:tokens]
        padding = self._written.shape[0] - 1
        if isinstance(self._written, np.ndarray):
            slots = np.asarray(slots)
            self._written[np.where(slots >= 0, slots // self.block_size, padding)] = self.index
            return
        import torch
        blocks = torch.where(slots >= 0, torch.div(slots, self.block_size,
                                                   rounding_mode="floor"),
                             torch.full_like(slots, padding))
        self._written[blocks.long()] = self.index

    def stale(self, block_table_row: Any, seq_len: int) -> int:
        """How many of a row's blocks (those its seq_len tokens fill) were
        written before the latest change of version (0 until a second
        version was set)."""
        if not self.active or self.index < 2:
            return 0
        n = (int(seq_len) + self.block_size - 1) // self.block_size
        if isinstance(self._written, np.ndarray):
            blocks = np.asarray(block_table_row[:n]).astype(np.int64)
        else:
            blocks = block_table_row[:n].long().to(self._written.device)
        return int((self._written[blocks] < self.index).sum())
