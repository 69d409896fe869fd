#!/usr/bin/env python3
"""README.md's defaults and its TLS/auth example against the real server
(ctest readme_defaults_test).

  defaults  each row of the README's defaults table (backend, data, gRPC,
            metrics, TLS, auth) states the default that
            `attnaudit-server --help` prints for its flag, the quick-start
            comment of `make run` agrees, and every flag the table names
            exists
  example   the README's TLS + token commands run in a temporary folder
            (openssl, the token file), the server starts with the
            SERVER_FLAGS of its `make run` line (plus a free port, metrics
            off and a temporary data dir, given after them), and its
            `attnaudit caps` command succeeds; the same call without the
            token is UNAUTHENTICATED and one in plaintext fails

Usage: readme_defaults_test.py --root REPO --server attnaudit-server
                               --cli attnaudit
Output: one PASS/FAIL line per check, then "N failed"; exit 1 on a failure.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

from checklist import check, failures, summary


def help_defaults(server):
    """{flag: default} from `attnaudit-server --help` ("--flag  text [default]")."""
    r = subprocess.run([server, "--help"], capture_output=True, text=True,
                       timeout=60)
    out = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r"^\s*--([a-z0-9-]+)\s+.*\[(.*)\]\s*$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def defaults_table(readme):
    """{first cell: (default cell, change cell)} of the table whose header
    is "| | default | to change it |"."""
    lines = readme.splitlines()
    start = next((i for i, l in enumerate(lines)
                  if re.match(r"^\|\s*\|\s*default\s*\|\s*to change it\s*\|",
                              l)), None)
    rows = {}
    if start is None:
        return rows
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3:
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def check_defaults(readme, defaults):
    rows = defaults_table(readme)
    check(set(rows) >= {"backend", "data", "gRPC", "metrics", "TLS", "auth"},
          "README has the defaults table (backend, data, gRPC, metrics, TLS, "
          "auth)", sorted(rows))
    if failures:
        return
    for flag in ("devices", "data-dir", "store", "listen", "metrics-listen",
                 "tls-cert", "auth-token-file"):
        check(flag in defaults, "--help shows --%s with its default" % flag)
    if failures:
        return
    check("`--devices=%s`" % defaults["devices"] in rows["backend"][0],
          "backend: --devices=%s" % defaults["devices"], rows["backend"][0])
    check(("`%s`" % defaults["data-dir"]) in rows["data"][0],
          "data: under %s" % defaults["data-dir"], rows["data"][0])
    check(defaults["store"] != "sqlite" or "SQLite" in rows["data"][0],
          "data: the %s store" % defaults["store"], rows["data"][0])
    check(("`%s`" % defaults["listen"]) in rows["gRPC"][0],
          "gRPC: %s" % defaults["listen"], rows["gRPC"][0])
    check(("http://%s/metrics" % defaults["metrics-listen"])
          in rows["metrics"][0],
          "metrics: http://%s/metrics" % defaults["metrics-listen"],
          rows["metrics"][0])
    for row, flag in (("TLS", "tls-cert"), ("auth", "auth-token-file")):
        off = defaults[flag] == '""'
        check(rows[row][0].startswith("off") == off,
              "%s: %s (--%s defaults to %s)"
              % (row, "off" if off else "on", flag, defaults[flag]),
              rows[row][0])
    named = set()
    for default, change in rows.values():
        named |= set(re.findall(r"--([a-z0-9-]+)", default + " " + change))
    unknown = sorted(n for n in named if n not in defaults)
    check(not unknown, "every flag the table names exists (%d)" % len(named),
          " ".join(unknown))
    m = re.search(r"^make run\s+#(.*?)^make test", readme, re.M | re.S)
    comment = m.group(1) if m else ""
    # "./var/attnaudit": the comment says "data under ./var".
    data_root = "/".join(defaults["data-dir"].split("/")[:2])
    for want in ("CPU backend", "data under %s" % data_root,
                 "gRPC %s" % defaults["listen"],
                 "metrics http://%s/metrics" % defaults["metrics-listen"]):
        check(want in " ".join(comment.split()),
              "the quick start's make run comment says %s" % want, comment)


def example_commands(readme):
    """The shell lines of the code block after "turn TLS and auth on",
    continuations joined."""
    m = re.search(r"turn TLS and auth on.*?^```sh\n(.*?)^```", readme,
                  re.M | re.S)
    if not m:
        return []
    commands, current = [], ""
    for line in m.group(1).splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip() and not current.strip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def check_example(readme, server, cli):
    commands = example_commands(readme)
    run_line = [c for c in commands if c.startswith("make run ")]
    caps_line = [c for c in commands if c.startswith("build/bin/attnaudit ")]
    setup = [c for c in commands if c not in run_line + caps_line]
    check(len(run_line) == 1 and len(caps_line) == 1 and setup,
          "README's TLS/auth example: setup, one make run, one CLI call",
          "\n".join(commands))
    if failures:
        return
    m = re.search(r'SERVER_FLAGS="([^"]*)"', run_line[0])
    check(m is not None, "the make run line passes SERVER_FLAGS=\"...\"")
    if not m:
        return
    server_flags = shlex.split(m.group(1))
    cli_args = shlex.split(caps_line[0])[1:]

    with tempfile.TemporaryDirectory() as tmp:
        for c in setup:
            r = subprocess.run(["bash", "-c", "set -eo pipefail; " + c],
                               cwd=tmp, capture_output=True, text=True,
                               timeout=120)
            check(r.returncode == 0, "runs: %s" % c, r.stdout + r.stderr)
        if failures:
            return
        log_path = os.path.join(tmp, "server.log")
        log = open(log_path, "w")
        proc = subprocess.Popen(
            [server] + server_flags +
            ["--listen", "localhost:0", "--metrics-listen=",
             "--data-dir", os.path.join(tmp, "data")],
            cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
        try:
            addr = None
            deadline = time.monotonic() + 60  # a bounded wait, not a check
            while addr is None and time.monotonic() < deadline and \
                    proc.poll() is None:
                text = open(log_path).read()
                found = re.search(r'msg="grpc listening" addr=(\S+) tls=on '
                                  r'auth=bearer', text)
                if found:
                    addr = found.group(1)
                else:
                    time.sleep(0.2)
            check(addr is not None,
                  "the server starts with the README's flags: tls=on "
                  "auth=bearer", open(log_path).read())
            if addr is None:
                return

            def cli_call(args):
                return subprocess.run([cli] + args + ["--addr", addr,
                                                      "--timeout", "20s"],
                                      cwd=tmp, capture_output=True,
                                      text=True, timeout=60)

            r = cli_call(cli_args)
            check(r.returncode == 0 and "attnaudit-server" in r.stdout,
                  "the README's `attnaudit %s` succeeds" % " ".join(cli_args),
                  r.stdout + r.stderr)
            no_token = [a for i, a in enumerate(cli_args)
                        if a != "--auth-token-file" and
                        (i == 0 or cli_args[i - 1] != "--auth-token-file")]
            r = cli_call(no_token)
            check(r.returncode != 0 and "UNAUTHENTICATED" in r.stderr,
                  "without the token: UNAUTHENTICATED", r.stdout + r.stderr)
            r = cli_call(["caps"])
            check(r.returncode != 0, "in plaintext: refused",
                  r.stdout + r.stderr)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    readme = open(os.path.join(args.root, "README.md"),
                  encoding="utf-8").read()
    server, cli = os.path.abspath(args.server), os.path.abspath(args.cli)
    check_defaults(readme, help_defaults(server))
    if not failures:
        check_example(readme, server, cli)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
