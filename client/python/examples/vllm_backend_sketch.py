"""Sketch: where the attnaudit hook goes in a vLLM attention backend.

NOT RUNNABLE AS IS. vLLM renames its internals between releases; this sketch
follows the V1 engine's FlashAttention backend (vllm/v1/attention/backends/
flash_attn.py, 2025 releases) and marks every vLLM name it relies on with
"# vLLM:". Check them against the release you run.

The idea: wrap the backend's forward(). After the kernel has written the
layer's output, offer the call to a RolloutAuditor with a *builder*: a
closure that is run only when the step is sampled and that builds the
snapshot from the very tensors the kernel used:

  * q        -- `query` as the backend receives it: already rotated by the
                model's RoPE (LlamaAttention applies rotary_emb before
                self.attn), so q_state/k_state stay "post" (the default);
  * kv_cache -- [2, num_blocks, block_size, Hkv, D]: layout="vllm". The
                current token's K/V are already in it (vLLM writes the cache
                before running attention);
  * block_table, seq_lens -- the *host* copies. The GPU tensors in
                attn_metadata would force a device sync; the model runner
                keeps CPU copies (InputBatch.block_table, seq_lens_cpu);
  * output   -- [num_tokens, Hq * D], taken as engine_out;
  * lse      -- only when the kernel was asked for it (return_softmax_lse);
                FlashAttention returns it as [Hq, num_tokens] in natural log:
                pass lse.T and lse_base="e".

On a CUDA engine the auditor runs the builder on a side stream: the page
gather is ordered after the kernel, the engine's stream waits only for that
gather, and the copy to pinned host memory overlaps the next layers.
"""

from __future__ import annotations

import dataclasses
import os

import attnaudit

# One client and one auditor per worker process.
_client = attnaudit.AuditClient(os.environ.get("ATTNAUDIT_ADDR", "localhost:50051"),
                                token=os.environ.get("ATTNAUDIT_TOKEN"))
AUDITOR = attnaudit.RolloutAuditor(
    _client,
    sample_every=int(os.environ.get("ATTNAUDIT_SAMPLE_EVERY", "200")),
    layers=[0, 15, 31],       # a few layers, one per sampled step:
    rotate_layers=True,       # every TP rank picks the same one
    max_in_flight=2)


@dataclasses.dataclass
class HostStepMeta:
    """What the model runner knows on the host for the current step; set
    once per step, before the forward pass (see install_step_meta)."""

    step: int
    block_table_cpu: object   # [num_reqs, max_blocks] int32, host
    seq_lens_cpu: object      # [num_reqs] int32, host
    decode_only: bool         # every request has exactly one query token


_STEP: HostStepMeta | None = None


def install_step_meta(meta: HostStepMeta) -> None:
    """Call from the model runner once per step (e.g. at the end of
    GPUModelRunner._prepare_inputs, where the host tables are final)."""
    global _STEP
    _STEP = meta


def wrap_flash_attention_impl(impl_cls):
    """Patches impl_cls.forward (vLLM: FlashAttentionImpl) with the hook."""
    original_forward = impl_cls.forward

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None,
                **kwargs):
        result = original_forward(self, layer, query, key, value, kv_cache, attn_metadata,
                                  output=output, **kwargs)
        meta = _STEP
        if meta is None or not meta.decode_only or attn_metadata is None:
            return result  # prefill / mixed batches: not audited here
        n = attn_metadata.num_actual_tokens                        # vLLM:
        layer_index = _layer_index(layer.layer_name)               # vLLM: "model.layers.7.self_attn.attn"
        num_heads, head_size = self.num_heads, self.head_size      # vLLM:

        def build():
            return attnaudit.Snapshot.from_paged_kv(
                query[:n],                                         # [B, Hq, D]
                kv_cache, None,                                    # fused [2, ...]
                meta.block_table_cpu[:n], meta.seq_lens_cpu[:n],
                layout="vllm",
                softmax_scale=self.scale,                          # vLLM:
                sliding_window=_hf_window(self.sliding_window),    # vLLM: (left, right)
                window_convention="hf",
                logit_softcap=self.logits_soft_cap or None,        # vLLM:
                sinks=getattr(self, "sinks", None),                # vLLM: gpt-oss
                k_scale=_fp8_scale(self, layer, "_k_scale_float"), # vLLM: fp8 KV
                v_scale=_fp8_scale(self, layer, "_v_scale_float"),
                engine_out=result[:n].view(n, num_heads, head_size),
                # The kernel's arithmetic and vLLM's RoPE rounding (cos/sin in
                # the model dtype): docs/PYTHON.md "Declaring the engine".
                # With the rotary seam wrapped too, pre_rope_q= and
                # pre_rope_k= (this step's q and new keys before RoPE) add
                # the rolling RoPE check.
                engine="vllm",
                labels={"engine": "vllm", "backend": "flash_attn",
                        "model": os.environ.get("ATTNAUDIT_MODEL", "")})

        AUDITOR.step(build, layer=layer_index, step=meta.step)
        return result

    impl_cls.forward = forward
    return impl_cls


def _layer_index(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])


def _hf_window(window):
    # vLLM keeps FlashAttention's (left, right) = (W - 1, 0) for an HF window
    # W, and (-1, -1) for none.
    if window is None or window[0] < 0:
        return None
    return window[0] + 1


def _fp8_scale(impl, layer, attr):
    if not str(getattr(impl, "kv_cache_dtype", "auto")).startswith("fp8"):
        return None
    return float(getattr(layer, attr, 1.0))


# Usage, in the worker process before the engine is built:
#
#   from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl  # vLLM:
#   wrap_flash_attention_impl(FlashAttentionImpl)
#
# and in the model runner, once per step:
#
#   install_step_meta(HostStepMeta(step=self.step_count,
#                                  block_table_cpu=<host block table>,
#                                  seq_lens_cpu=<host seq lens>,
#                                  decode_only=max_query_len == 1))
#
# FlashInfer backends: kv_cache is [num_blocks, 2, block_size, Hkv, D] (NHD)
# or [num_blocks, 2, Hkv, block_size, D] (HND): layout="flashinfer_nhd" /
# "flashinfer_hnd", and FlashInfer's LSE is base 2: lse_base="2".
# SGLang: the per-layer token pool k_buffer/v_buffer [slots, Hkv, D] reshaped
# to [slots // page_size, page_size, Hkv, D] is the "nhd" layout with page
# ids = slot // page_size.
