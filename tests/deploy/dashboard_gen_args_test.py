#!/usr/bin/env python3
"""The command line of deploy/grafana/dashboard_gen.py (ctest
dashboard_gen_args_test): --help and -h print the usage and write nothing,
an unknown option exits 2 and writes nothing, --check compares without
writing (exit 1 on a stale file, 0 on current ones), and no option rewrites
both dashboards.

The script writes next to itself (dashboards/), so it runs from a copy in a
temporary directory: the committed JSONs are never touched. Standard
library only.

Usage: dashboard_gen_args_test.py [REPO_ROOT]
"""
import os
import shutil
import subprocess
import sys
import tempfile

from checklist import check, summary

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
GEN = os.path.join(ROOT, "deploy", "grafana", "dashboard_gen.py")
NAMES = ("attnaudit.json", "attnaudit-store.json")
STALE = "stale, not a dashboard\n"


def contents(dashboards):
    out = {}
    for name in NAMES:
        with open(os.path.join(dashboards, name), encoding="utf-8") as f:
            out[name] = f.read()
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "dashboard_gen.py")
        shutil.copy(GEN, script)
        dashboards = os.path.join(tmp, "dashboards")
        os.mkdir(dashboards)
        for name in NAMES:
            with open(os.path.join(dashboards, name), "w",
                      encoding="utf-8") as f:
                f.write(STALE)

        def run(*args):
            return subprocess.run([sys.executable, script, *args],
                                  capture_output=True, text=True,
                                  timeout=60)

        for flag in ("--help", "-h"):
            r = run(flag)
            check(r.returncode == 0 and "usage:" in r.stdout
                  and "--check" in r.stdout,
                  "%s prints the usage (exit %d)" % (flag, r.returncode))
            check(contents(dashboards) == {n: STALE for n in NAMES},
                  "%s writes nothing" % flag)

        r = run("--no-such-option")
        check(r.returncode == 2 and "unrecognized arguments" in r.stderr,
              "an unknown option exits 2 (exit %d)" % r.returncode)
        check(contents(dashboards) == {n: STALE for n in NAMES},
              "an unknown option writes nothing")

        r = run("--check")
        check(r.returncode == 1 and all(n in r.stdout for n in NAMES),
              "--check on stale files exits 1 naming both (exit %d)"
              % r.returncode)
        check(contents(dashboards) == {n: STALE for n in NAMES},
              "--check writes nothing")

        r = run()
        check(r.returncode == 0, "no option: exit 0 (exit %d)" % r.returncode)
        written = contents(dashboards)
        check(all(text != STALE for text in written.values()),
              "no option rewrites both dashboards")
        committed = contents(os.path.join(ROOT, "deploy", "grafana",
                                          "dashboards"))
        check(written == committed,
              "what it writes is the committed dashboards")

        r = run("--check")
        check(r.returncode == 0,
              "--check on current files exits 0 (exit %d)" % r.returncode)

    return summary()


if __name__ == "__main__":
    sys.exit(main())
