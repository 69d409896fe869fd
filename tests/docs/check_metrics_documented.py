#!/usr/bin/env python3
"""Fails when a metric family the server declares is not documented.

Every family name the metrics component declares (a string literal
"attnaudit_..." in server/metrics/*.cc) must have a row in the table of
docs/OPERATIONS.md, "### Metrics" (a cell starting with the name in
backquotes), and a line in the family list of server/metrics/metrics.h's
file comment. A row or a line for a family the code no longer declares is
reported too. docs/EXTENDING.md, "A metric", is the path this guards.

Usage:

  check_metrics_documented.py REPO_ROOT     check the tree, exit 1 on a gap
  check_metrics_documented.py --self-test   plant a family the docs lack,
                                            and a row for one the code
                                            lacks, and expect exactly those
"""
import glob
import os
import re
import shutil
import sys
import tempfile

NAME = r"attnaudit_[a-z0-9_]+"


def declared(root):
    names = set()
    for path in glob.glob(os.path.join(root, "server", "metrics", "*.cc")):
        with open(path, encoding="utf-8") as f:
            names.update(re.findall(r'"(' + NAME + r')"', f.read()))
    return names


def operations_rows(root):
    with open(os.path.join(root, "docs", "OPERATIONS.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.find("\n### Metrics\n")
    if start < 0:
        return None
    end = text.find("\n#", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `attnaudit_"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`(" + NAME + r")`", first_cell))
    return names


def header_lines(root):
    with open(os.path.join(root, "server", "metrics", "metrics.h"),
              encoding="utf-8") as f:
        return set(re.findall(r"^//\s+(" + NAME + r")\b", f.read(), re.M))


def problems(root):
    out = []
    code = declared(root)
    if not code:
        return ["server/metrics: no family names found"]
    rows = operations_rows(root)
    if rows is None:
        return ["docs/OPERATIONS.md: no '### Metrics' section"]
    listed = header_lines(root)
    for name in sorted(code - rows):
        out.append(f"docs/OPERATIONS.md: no row for {name}")
    for name in sorted(rows - code):
        out.append(f"docs/OPERATIONS.md: a row for {name}, which the code "
                   "does not declare")
    for name in sorted(code - listed):
        out.append(f"server/metrics/metrics.h: no line for {name}")
    return out


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    with tempfile.TemporaryDirectory() as tmp:
        for rel in ["server/metrics", "docs"]:
            os.makedirs(os.path.join(tmp, rel))
        for path in glob.glob(os.path.join(root, "server", "metrics", "*")):
            shutil.copy(path, os.path.join(tmp, "server", "metrics"))
        shutil.copy(os.path.join(root, "docs", "OPERATIONS.md"),
                    os.path.join(tmp, "docs"))
        if problems(tmp):
            print("self-test: the unmodified copy is not clean:",
                  problems(tmp))
            return 1
        with open(os.path.join(tmp, "server", "metrics", "planted.cc"), "w",
                  encoding="utf-8") as f:
            f.write('auto& x = Family(r, "attnaudit_planted_total", "...");\n')
        ops = os.path.join(tmp, "docs", "OPERATIONS.md")
        with open(ops, encoding="utf-8") as f:
            text = f.read()
        anchor = "| `attnaudit_build_info` |"
        text = text.replace(anchor,
                            "| `attnaudit_gone_total` | counter | |\n" + anchor,
                            1)
        with open(ops, "w", encoding="utf-8") as f:
            f.write(text)
        want = [
            "docs/OPERATIONS.md: no row for attnaudit_planted_total",
            "docs/OPERATIONS.md: a row for attnaudit_gone_total, which the "
            "code does not declare",
            "server/metrics/metrics.h: no line for attnaudit_planted_total",
        ]
        got = problems(tmp)
        if got != want:
            print("self-test: expected", want, "got", got)
            return 1
    print("self-test: ok")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    found = problems(argv[1])
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
