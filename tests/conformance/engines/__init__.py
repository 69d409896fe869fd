"""Drivers that run real engine code and capture attnaudit snapshots.

One module per engine family; each exposes `capture(spec) -> Capture`,
where `spec` is a `common.CaseSpec` (the model variant, dtype, mode, bug
and options of one conformance case) and the Capture holds the keyword
arguments of `attnaudit.Snapshot.from_paged_kv` plus the truth about any
injected bug:

  vllm_cpu     vLLM's CPU kernels (rotary_embedding, cpu_attn_reshape_and_cache,
               cpu_attention_with_kv_cache), called as vLLM's CPU backend calls them
  hf           Hugging Face transformers models with tiny random configs,
               eager and sdpa attention, captured by wrapping the modeling
               module's apply_rotary_pos_emb and attention function
  torch_flash  torch's CPU flash attention
               (aten._scaled_dot_product_flash_attention_for_cpu), with its LSE

Engine modules import torch / vllm / transformers lazily (inside the
functions), so `cases.py` can list the catalogue without them.
"""
