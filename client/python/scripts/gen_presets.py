#!/usr/bin/env python3
"""Writes attnaudit/_presets.py from the server's one table of engine presets.

core/engine/presets.h is the only place the presets are written; the package
carries this generated copy so that it installs without the repository.
tests/python/test_presets.py fails while the file differs from what this
script renders from `attnaudit presets --json`.

usage: gen_presets.py --cli build/bin/attnaudit [--check]   (or: make py-presets)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Dict

TARGET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "src", "attnaudit", "_presets.py")

HEADER = '''"""The engine presets of the builders' engine=... argument (re-exported as
attnaudit.ENGINE_PRESETS / attnaudit.HF_FAMILY_CAST_POINTS): data only,
so both the snapshot builders and attnaudit.probe read them without
importing each other.

GENERATED from core/engine/presets.h by client/python/scripts/gen_presets.py
(make py-presets); do not edit. The package carries it so that it installs
without the repository; tests/python/test_presets.py fails while it differs
from the server's table."""

from typing import Dict
'''


def _wire(name: str) -> str:
    """The precision profile as the Python enums spell it (vllm-cpu -> vllm_cpu)."""
    return name.replace("-", "_")


def render(table: Dict[str, Any]) -> str:
    """The text of _presets.py for `attnaudit presets --json`'s table."""
    lines = [HEADER,
             "# What the builders declare for an engine (engine=...): its attention",
             "# precision profile, where its RoPE rounds (docs/NUMERICS.md, \"Engine",
             "# precision\", \"RoPE arithmetic\"). The conformance suite checks each",
             "# on the engine's own code, except the GPU kernels' (docs/CONFORMANCE.md).",
             "ENGINE_PRESETS: Dict[str, Dict[str, str]] = {"]
    for name, p in table["engine_presets"].items():
        precision, cast_point = json.dumps(_wire(p["precision"])), json.dumps(p["cast_point"])
        lines.append(f"    {json.dumps(name)}: "
                     f"{{\"precision\": {precision}, \"cast_point\": {cast_point}}},")
    lines += ["}", "",
              "# The RoPE cast point of each Hugging Face family whose modeling code",
              "# rounds its RoPE differently from Llama's: engine=\"hf-eager/<family>\".",
              "HF_FAMILY_CAST_POINTS: Dict[str, str] = {"]
    for family, point in table["hf_family_cast_points"].items():
        lines.append(f"    {json.dumps(family)}: {json.dumps(point)},")
    lines += ["}", "",
              "# A family not listed rotates as Llama does.",
              f"HF_DEFAULT_CAST_POINT = {json.dumps(table['hf_default_cast_point'])}", ""]
    return "\n".join(lines)


def table_of(cli: str) -> Dict[str, Any]:
    out = subprocess.run([cli, "presets", "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", required=True, help="the attnaudit CLI binary")
    parser.add_argument("--check", action="store_true", help="fail if the file differs")
    args = parser.parse_args()
    text = render(table_of(args.cli))
    with open(TARGET, encoding="utf-8") as f:
        current = f.read()
    if args.check:
        if current != text:
            print(f"gen_presets.py: {TARGET} differs from the server's table; "
                  "run make py-presets", file=sys.stderr)
            return 1
        return 0
    if current != text:
        with open(TARGET, "w", encoding="utf-8") as f:
            f.write(text)
    print(f"gen_presets.py: {TARGET} {'rewritten' if current != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
