#!/usr/bin/env python3
"""The recipe for a local Prometheus beside `make run` (ctest
local_prometheus_test): the commands in the header of
deploy/prometheus/prometheus.yml, which docs/DEPLOYMENT.md ("Prometheus
beside `make run`") repeats word for word, are run in a temporary copy of
deploy/prometheus/. The copy they make must pass `promtool check config`
(its rule file resolves), scrape localhost:9464 in job attnaudit (the
job the alerts select) and nothing else there, and Prometheus itself on the
address the recipe makes it listen on; the `prometheus` command's
flags must be flags of the installed prometheus. Prometheus itself is not
started (its port is fixed in the recipe).

Usage: local_prometheus_test.py REPO_ROOT PROMTOOL PROMETHEUS
Needs PyYAML (Debian: python3-yaml); exits 77 without it.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from checklist import check, failures, summary

ROOT, PROMTOOL, PROMETHEUS = sys.argv[1:4]
CONFIG = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
DOC = os.path.join(ROOT, "docs", "DEPLOYMENT.md")


def join_continuations(lines):
    commands, current = [], ""
    for line in lines:
        line = line.rstrip()
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
        else:
            commands.append(re.sub(r"\s+", " ", current + line.strip()))
            current = ""
    return [c for c in commands if c]


def recipe_from_config():
    lines = open(CONFIG, encoding="utf-8").read().splitlines()
    # The first block of "#   " lines after the note on `make run`.
    start = next((i for i, l in enumerate(lines) if "`make run`" in l),
                 len(lines))
    body = []
    for line in lines[start + 1:]:
        if line.startswith("#   "):
            body.append(line[4:])
        elif body:
            break
    return join_continuations(body)


def recipe_from_doc():
    text = open(DOC, encoding="utf-8").read()
    m = re.search(r"^### Prometheus beside `make run`\n(.*?)^```sh\n(.*?)^```",
                  text, re.M | re.S)
    return join_continuations(m.group(2).splitlines()) if m else []


def main():
    try:
        import yaml
    except ImportError:
        print("PyYAML not installed (Debian: python3-yaml)")
        return 77
    recipe = recipe_from_config()
    check(len(recipe) >= 3, "prometheus.yml's header has the local recipe "
          "(%d commands)" % len(recipe))
    check(recipe == recipe_from_doc(),
          "docs/DEPLOYMENT.md shows the same commands as prometheus.yml")
    launch = [c for c in recipe if c.startswith("prometheus ")]
    check(len(launch) == 1, "the recipe starts prometheus once")
    if failures:
        print("%d failed" % len(failures))
        return 1

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(ROOT, "deploy", "prometheus"),
                        os.path.join(tmp, "deploy", "prometheus"))
        for command in recipe:
            if command in launch:
                continue
            r = subprocess.run(["bash", "-c", "set -eo pipefail; " + command],
                               cwd=tmp, capture_output=True, text=True,
                               timeout=60)
            check(r.returncode == 0, "runs: %s%s" % (
                command, "" if r.returncode == 0 else "\n" + r.stderr))

        argv = shlex.split(launch[0])
        flags = dict(a[2:].split("=", 1) for a in argv[1:]
                     if a.startswith("--") and "=" in a)
        check(len(flags) == len(argv) - 1,
              "prometheus's arguments are all --flag=value")
        help_text = subprocess.run([PROMETHEUS, "--help"],
                                   capture_output=True, text=True,
                                   timeout=60)
        help_text = help_text.stdout + help_text.stderr
        for name in flags:
            check("--" + name + "=" in help_text,
                  "--%s is a flag of %s" % (name, PROMETHEUS))
        config = flags.get("config.file", "")
        path = os.path.join(tmp, config)
        check(os.path.isfile(path), "the recipe writes %s" % config)
        if not os.path.isfile(path):
            print("%d failed" % len(failures))
            return 1

        r = subprocess.run([PROMTOOL, "check", "config", path], cwd=tmp,
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0,
              "promtool check config %s (rule files resolve)%s"
              % (config, "" if r.returncode == 0 else "\n" + r.stdout +
                 r.stderr))

        parsed = yaml.safe_load(open(path, encoding="utf-8"))
        jobs = {j["job_name"]: j for j in parsed.get("scrape_configs", [])}
        targets = [t for sc in jobs.get("attnaudit", {}).get(
                       "static_configs", []) for t in sc.get("targets", [])]
        check(targets == ["localhost:9464"],
              "job attnaudit scrapes localhost:9464 only (%s)" % targets)
        listen = flags.get("web.listen-address")
        own = [t for sc in jobs.get("prometheus", {}).get(
                   "static_configs", []) for t in sc.get("targets", [])]
        check(own == [listen], "job prometheus scrapes the address it "
              "listens on, %s (%s)" % (listen, own))
        original = yaml.safe_load(open(CONFIG, encoding="utf-8"))
        orig_targets = [t for j in original["scrape_configs"]
                        if j["job_name"] == "attnaudit"
                        for sc in j.get("static_configs", [])
                        for t in sc.get("targets", [])]
        check(orig_targets == ["attnaudit:9464"],
              "the committed config scrapes the compose service "
              "attnaudit:9464 (%s)" % orig_targets)

    return summary()


if __name__ == "__main__":
    sys.exit(main())
