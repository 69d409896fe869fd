"""Test helper: turns a snapshot into the tensors an engine would hold.

Given a snapshot in wire layout (e.g. one written by `attnaudit synth`),
scatter its pages into an engine-style KV cache of another layout, with
other page numbers, extra blocks full of NaN that no row references, stale
block-table entries past each row's length, and per-row token positions --
everything Snapshot.from_paged_kv must see through. The engine-side
tensors, fed back through the builder, must give the same report as the
original snapshot.
"""

from __future__ import annotations

import numpy as np

from attnaudit.v1 import snapshot_pb2

LAYOUTS = ("vllm", "vllm_split", "vllm_hnd_strides", "flashinfer_nhd",
           "flashinfer_hnd", "nhd", "hnd")


def _nan_like(a: np.ndarray, shape) -> np.ndarray:
    out = np.empty(shape, dtype=a.dtype)
    out[...] = np.nan
    return out


def engine_tensors(snap, layout: str, seed: int = 7):
    """(args, kwargs) for Snapshot.from_paged_kv reproducing `snap`."""
    rng = np.random.default_rng(seed)
    k = snap.tensor("k_pages")
    v = snap.tensor("v_pages")
    if snap.meta.kv_layout == snapshot_pb2.KV_LAYOUT_HND:
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    N, P, H, D = k.shape
    bt = snap.tensor("block_table").astype(np.int64)
    if "page_ids" in snap.tensor_paths():  # engine ids -> pool indices
        ids = snap.tensor("page_ids").astype(np.int64)
        where = {int(x): i for i, x in enumerate(ids)}
        bt = np.vectorize(lambda x: where.get(int(x), -1))(bt)
    lens = snap.tensor("kv_seq_lens").astype(np.int64)
    slot_pos = snap.tensor("slot_positions").astype(np.int64)
    B = len(lens)

    num_blocks = N + 9
    engine_id = rng.permutation(num_blocks)[:N]  # pool index -> engine id
    # The engine's table: engine ids, stale garbage past each row's end.
    table = rng.integers(0, num_blocks, size=(B, bt.shape[1] + 2))
    key_pos = np.zeros((B, int(lens.max())), dtype=np.int64)
    for b in range(B):
        n = -(-int(lens[b]) // P)
        table[b, :n] = engine_id[bt[b, :n]]
        t = np.arange(int(lens[b]))
        key_pos[b, :len(t)] = slot_pos[bt[b, t // P], t % P]

    def pool(src, hnd):
        shape = (num_blocks, H, P, D) if hnd else (num_blocks, P, H, D)
        out = _nan_like(src, shape)
        out[engine_id] = src.transpose(0, 2, 1, 3) if hnd else src
        return out

    if layout == "vllm":
        cache = np.stack([pool(k, False), pool(v, False)])
        caches, name = (cache, None), "vllm"
    elif layout == "vllm_split":
        caches, name = (pool(k, False), pool(v, False)), "vllm"
    elif layout == "vllm_hnd_strides":
        # vLLM's HND stride order: physically [2, nb, H, P, D], seen as the
        # logical [2, nb, P, H, D] through a transposed view.
        phys = np.stack([pool(k, True), pool(v, True)])
        caches, name = (phys.transpose(0, 1, 3, 2, 4), None), "vllm"
    elif layout == "flashinfer_nhd":
        caches, name = (np.stack([pool(k, False), pool(v, False)], axis=1), None), layout
    elif layout == "flashinfer_hnd":
        caches, name = (np.stack([pool(k, True), pool(v, True)], axis=1), None), layout
    elif layout == "nhd":
        caches, name = (pool(k, False), pool(v, False)), "nhd"
    elif layout == "hnd":
        caches, name = (pool(k, True), pool(v, True)), "hnd"
    else:
        raise ValueError(layout)

    q = snap.tensor("q")
    if q.shape[1] == 1:
        q = q[:, 0]  # the engine's decode q: [B, Hq, D]
    args = (q, caches[0], caches[1], table, lens)
    kwargs = dict(layout=name, key_positions=key_pos, **wire_options(snap))
    return args, kwargs, engine_id


def wire_options(snap) -> dict:
    """The builder keyword options that reproduce `snap`'s other fields."""
    m = snap.meta
    paths = snap.tensor_paths()
    t = lambda p: snap.tensor(p) if p in paths else None  # noqa: E731
    kw = dict(softmax_scale=m.softmax_scale or None,
              sliding_window=m.sliding_window or None,
              window_convention=m.window_convention or None,
              logit_softcap=m.logit_softcap or None, sinks=t("sinks"),
              engine_lse_includes_sinks=m.engine_lse_includes_sinks,
              rope=m.rope if m.HasField("rope") else None,
              output_dtype=m.output_dtype or None, k_scale=t("k_scale"),
              v_scale=t("v_scale"), engine_out=t("engine.out"),
              engine_lse=t("engine.lse"), engine_logprobs=t("engine.logprobs"),
              selected_token_ids=t("selected_token_ids"), lm_head=t("lm_head"),
              active_mask=t("active_mask"),
              logprob_temperature=m.logprob_temperature or None,
              labels=m.labels,
              precision=m.precision if m.HasField("precision") else None,
              pre_rope_q=t("pre_rope.q"), pre_rope_k=t("pre_rope.k"))
    table = {k: t(f"rope_table.{k}") for k in ("inv_freq", "positions", "cos", "sin")}
    if any(v is not None for v in table.values()):
        kw["rope_table"] = {k: v for k, v in table.items() if v is not None}
    if m.HasField("engine"):
        kw["lse_base"] = {snapshot_pb2.LSE_BASE_2: "2"}.get(m.engine.lse_base, "e")
    if m.HasField("cp") and m.cp.world_size > 1:
        kw.update(cp_world_size=m.cp.world_size, cp_sharding=m.cp.sharding,
                  cp_interleave_size=m.cp.interleave_size)
    if m.prefix.enabled:
        kw.update(prefix_key=m.prefix.key, prefix_length=m.prefix.length,
                  prefix_fingerprint=m.prefix.fingerprint,
                  prefix_scheme=m.prefix.scheme)
    return kw


def to_torch(args, kwargs):
    """The same engine tensors as torch CPU tensors (bf16 and fp8 through
    integer views: torch.from_numpy knows neither)."""
    import torch

    def conv(x):
        if not isinstance(x, np.ndarray):
            return x
        x = np.array(x)  # a writable contiguous copy
        name = x.dtype.name
        if name == "bfloat16":
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        if name in ("float8_e4m3fn", "float8_e5m2"):
            return torch.from_numpy(x.view(np.uint8)).view(getattr(torch, name))
        return torch.from_numpy(x)

    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}
