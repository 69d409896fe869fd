"""The trainer's side: Hugging Face attention captured during a forward.

RL trainers recompute the rollout's log-probs with a transformers model
(the "old log-prob" or first training forward). TrainerHook wraps every
attention function transformers dispatches to (eager, sdpa,
flash_attention_2, ... through `AttentionInterface.get_interface`, which
the models call per layer) and, inside `capture(...)`, keeps for sampled
sequences, layers and positions what the trainer's kernel used and
produced: the post-RoPE q of those positions, the keys and values before
them, the output, and the layer's scale, soft-cap, window and sinks. Each
(sequence, layer) becomes one decode-shaped Snapshot whose rows are the
sampled positions, labelled role="trainer" with the sequence's sample id
(the rollout's request id), layer, step, run and the weight version given
to capture(): what the server joins with the rollout's snapshots of the
same run once both are audited (AuditClient.list_pairs), what
attnaudit.pairs compares offline, and what the server audits like any
engine's.

    hook = TrainerHook(auditor_or_callback, layers=[0, 15, 31], run="grpo-7")
    hook.install()
    with hook.capture(sample_ids=batch_request_ids, step=global_step,
                      lengths=valid_lengths, weight_version=str(synced_step)):
        logits = model(input_ids, attention_mask=mask).logits

Sequences are rows of the batch, right-padded to `lengths` (packed or
varlen batches are not read). Positions: `positions(sample_id, length)`
or, by default, the last `max_rows` of each sequence (the generated
tokens, where a decode step's query sits).

Cost: nothing outside capture(); inside it, per sampled layer, a copy to
the host of one sequence's K/V up to its last sampled position and the
sampled rows of q and the output (synchronous on a GPU), then the sink:
a RolloutAuditor (bounded in flight, background send, drops counted), or
any callable taking the Snapshot (e.g. to save it).

Thread safety: install()/uninstall() are process-wide; capture() is per
thread (a contextvar), so data-parallel threads capture their own rows.
Errors: a failure while capturing is counted (`errors`) and kept in
`last_error`, never raised into the trainer's forward.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

PAGE = 16  # tokens per page of the snapshots built here

_ACTIVE: contextvars.ContextVar[Optional["_Capture"]] = contextvars.ContextVar(
    "attnaudit_trainer_capture", default=None)
_WRAPPED = "_attnaudit_trainer_wrapped"
_ORIGINAL_GET: List[Any] = [None]


@dataclasses.dataclass
class _Capture:
    hook: "TrainerHook"
    sample_ids: Sequence[Optional[str]]
    step: Optional[int]
    lengths: Optional[Sequence[int]]
    positions: Optional[Callable[[str, int], Sequence[int]]]
    weight_version: Optional[str] = None


class TrainerHook:
    """See the module docstring. sink: a RolloutAuditor (its step() gets a
    builder), or a callable taking each Snapshot. layers: None for all.
    engine: the precision preset declared (default "hf-<implementation>"
    for eager and sdpa, none otherwise)."""

    def __init__(self, sink: Any, *, layers: Optional[Sequence[int]] = None,
                 max_rows: int = 16, run: Optional[str] = None,
                 engine: Optional[str] = None, model: Optional[str] = None):
        if max_rows < 1:
            raise ValueError(f"max_rows: must be >= 1, got {max_rows}")
        self.sink = sink
        self.layers = None if layers is None else frozenset(int(x) for x in layers)
        self.max_rows = int(max_rows)
        self.run = run
        self.engine = engine
        self.model = model
        self.captured = 0
        self.errors = 0
        self.last_error: Optional[BaseException] = None

    # ------------------------------------------------------------------

    def install(self) -> None:
        """Wraps transformers' attention dispatch (process-wide, once)."""
        from transformers.modeling_utils import AttentionInterface
        if _ORIGINAL_GET[0] is None:
            _ORIGINAL_GET[0] = AttentionInterface.get_interface
            AttentionInterface.get_interface = _get_interface

    @staticmethod
    def uninstall() -> None:
        from transformers.modeling_utils import AttentionInterface
        if _ORIGINAL_GET[0] is not None:
            AttentionInterface.get_interface = _ORIGINAL_GET[0]
            _ORIGINAL_GET[0] = None

    @contextlib.contextmanager
    def capture(self, sample_ids: Sequence[Optional[str]], *, step: Optional[int] = None,
                lengths: Optional[Sequence[int]] = None,
                positions: Optional[Callable[[str, int], Sequence[int]]] = None,
                weight_version: Any = None) -> Iterator[None]:
        """Captures the forwards run inside: batch row b is sample
        sample_ids[b] (None: not captured), lengths[b] tokens long.
        weight_version: the policy weights the trainer computes with (e.g.
        the step of the last weight sync to the rollout engine), put on the
        snapshots as text; a pair whose rollout names another version says
        so (attnaudit pairs --rows). None: unknown."""
        token = _ACTIVE.set(_Capture(self, list(sample_ids), step, lengths, positions,
                                     None if weight_version is None
                                     else str(weight_version)))
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    # ------------------------------------------------------------------

    def _take(self, cap: _Capture, implementation: str, module: Any, query: Any,
              key: Any, value: Any, output: Any, kwargs: Dict[str, Any]) -> None:
        layer = getattr(module, "layer_idx", None)
        if layer is None or (self.layers is not None and int(layer) not in self.layers):
            return
        for b, sample in enumerate(cap.sample_ids):
            if sample is None:
                continue
            length = int(cap.lengths[b]) if cap.lengths is not None else int(query.shape[2])
            rows = self._positions(cap, str(sample), length)
            if rows:
                snapshot = self._snapshot(cap, implementation, module, int(layer), b, rows,
                                          str(sample), query, key, value, output, kwargs)
                self._send(snapshot, int(layer), cap.step)

    def _positions(self, cap: _Capture, sample: str, length: int) -> List[int]:
        if cap.positions is not None:
            rows = sorted({int(p) for p in cap.positions(sample, length) if 0 <= p < length})
        else:
            rows = list(range(max(0, length - self.max_rows), length))
        return rows[-self.max_rows:]

    def _snapshot(self, cap: _Capture, implementation: str, module: Any, layer: int,
                  b: int, rows: List[int], sample: str, query: Any, key: Any, value: Any,
                  output: Any, kwargs: Dict[str, Any]) -> Any:
        import torch

        from .snapshot import Snapshot
        n_keys = rows[-1] + 1
        pages = (n_keys + PAGE - 1) // PAGE
        host = {"device": "cpu"}
        q = query[b, :, rows, :].transpose(0, 1).detach().to(**host)      # [n, Hq, D]
        out = output[b, rows].detach().to(**host)                           # [n, Hq, D]
        k_pages, v_pages = (_paged(x[b, :, :n_keys].detach().to(**host), pages, torch)
                            for x in (key, value))
        table = torch.arange(pages, dtype=torch.int32).repeat(len(rows), 1)
        window = kwargs.get("sliding_window")
        sinks = getattr(module, "sinks", None)
        return Snapshot.from_paged_kv(
            q, k_pages, v_pages, table, torch.tensor([p + 1 for p in rows]),
            layout="nhd", engine_out=out,
            softmax_scale=float(kwargs.get("scaling") or getattr(module, "scaling", 0.0)
                                or q.shape[-1] ** -0.5),
            logit_softcap=kwargs.get("softcap") or None,
            sliding_window=int(window) if window else None,
            window_convention="hf" if window else None,
            sinks=None if sinks is None else sinks.detach().float().to(**host),
            engine=self.engine or _preset(implementation),
            labels=_labels(engine="hf", backend=implementation, layer=layer, step=cap.step,
                           run=self.run, model=self.model, request_ids=[sample] * len(rows),
                           role="trainer", weight_version=cap.weight_version))

    def _send(self, snapshot: Any, layer: int, step: Optional[int]) -> None:
        self.captured += 1
        step_fn = getattr(self.sink, "step", None)
        if step_fn is not None:
            step_fn(snapshot, layer=layer, step=step or 0, run=self.run)
        else:
            self.sink(snapshot)

    def _error(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error = e


def _paged(x: Any, pages: int, torch: Any) -> Any:
    """[Hkv, n, D] -> pages [pages, PAGE, Hkv, D], zero-padded."""
    hkv, n, d = x.shape
    padded = torch.zeros((pages * PAGE, hkv, d), dtype=x.dtype)
    padded[:n] = x.transpose(0, 1)
    return padded.view(pages, PAGE, hkv, d)


def _labels(**labels: Any) -> Dict[str, Any]:
    return {k: v for k, v in labels.items() if v is not None}


def _preset(implementation: str) -> Optional[str]:
    return {"eager": "hf-eager", "sdpa": "hf-sdpa"}.get(implementation)


def _get_interface(self: Any, attn_implementation: str, default: Callable[..., Any]
                   ) -> Callable[..., Any]:
    fn = _ORIGINAL_GET[0](self, attn_implementation, default)
    if getattr(fn, _WRAPPED, False):
        return fn
    return _wrap(fn, attn_implementation or "eager")


def _wrap(fn: Callable[..., Any], implementation: str) -> Callable[..., Any]:
    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  *args: Any, **kwargs: Any) -> Any:
        result = fn(module, query, key, value, attention_mask, *args, **kwargs)
        cap = _ACTIVE.get()
        if cap is not None:
            try:
                cap.hook._take(cap, implementation, module, query, key, value, result[0],
                               kwargs)
            except Exception as e:  # noqa: BLE001 - never break the trainer's forward
                cap.hook._error(e)
        return result
    setattr(attention, _WRAPPED, True)
    return attention
