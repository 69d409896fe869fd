"""The vLLM plugin's step summaries in a W&B-style logger.

The plugin calls each `on_step` callback with a StepSummary per audited
engine step, on a background thread of the process that runs the engine.
This module is such a callback. Point the plugin at it, with this folder on
PYTHONPATH:

    export ATTNAUDIT_VLLM_SERVER=attnaudit:50051
    export ATTNAUDIT_VLLM_ON_STEP=vllm_plugin_logger:log_step

`log_step` logs to Weights & Biases when a run is active in the process
(wandb.run), else prints one line. An in-process engine (verl's and
OpenRLHF's colocated rollouts, `vllm.LLM` with
VLLM_ENABLE_V1_MULTIPROCESSING=0) can instead register a callback in code:
attnaudit.vllm.add_step_callback(log_step).

Run it (the conformance venv has vLLM's CPU build):

    build/conformance-venv/bin/python client/python/examples/vllm_plugin_logger.py \
        --model build/vllm-plugin/tiny-llama3 --server 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import os
import sys


def log_step(summary) -> None:
    """An on_step callback: the summary's numbers under attnaudit/, at the
    engine step the audit sampled."""
    metrics = summary.as_dict(prefix="attnaudit/")
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.log(metrics, commit=False)
    else:
        print(summary.line(), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a local model directory")
    ap.add_argument("--server", default="localhost:50051")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["ATTNAUDIT_VLLM_SERVER"] = args.server
    os.environ.setdefault("ATTNAUDIT_VLLM_SAMPLE_EVERY", "8")
    os.environ["ATTNAUDIT_VLLM_LOG_SUMMARY"] = "0"  # log_step prints instead
    from vllm import LLM, SamplingParams

    import attnaudit.vllm
    llm = LLM(model=args.model, gpu_memory_utilization=0.1, max_model_len=512,
              enforce_eager=True)
    attnaudit.vllm.add_step_callback(log_step)
    llm.generate([{"prompt_token_ids": list(range(3, 40))}] * 2,
                 SamplingParams(max_tokens=args.tokens, temperature=0.0,
                                ignore_eos=True))
    attnaudit.vllm.flush(60)
    print(attnaudit.vllm.plugin().counters())
    return 0


if __name__ == "__main__":
    sys.exit(main())
