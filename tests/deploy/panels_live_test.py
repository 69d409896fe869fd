#!/usr/bin/env python3
"""Every panel of the dashboard against a real Prometheus scraping a real
attnaudit-server that was fed known audits (ctest dashboard_panels_test).

  panels_live_test.py --server BIN --cli BIN --prometheus BIN [--keep DIR]

1. Starts attnaudit-server on 127.0.0.1 (kernel-picked ports, one CPU worker)
   and Prometheus on a free loopback port with a temporary config: job
   "attnaudit" (1 s scrape interval) and job "other-service", a target where
   nothing listens, standing for the other services of a shared Prometheus.
2. Feeds known audits through the attnaudit CLI: clean and lse-base2
   snapshots (PASS, DRIFT), one invalid snapshot sent to Audit, AuditStream
   and Submit, and clean Submits. Their offline reports (`check --json`) are
   the truth for the drift values.
3. Evaluates every target of every panel through Prometheus' HTTP API, with
   the dashboard's variables resolved as Grafana resolves their defaults
   (the job variable from its own label_values query), and checks each
   against the number it must show: exact where the counters make it exact
   (fractions, ratios, gauges), the bucket range of the observed values for
   quantiles, and "returns data, no error" where a value depends on timing
   (rates in ops/s, latencies).

Robust on a loaded machine: every wait is bounded and generous, rate windows
span the whole run (10m) so that ratios of counters created at zero are
exact, and nothing asserts a time. Prints "N passed, N failed"; exit 1 on
any failure.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "dashboards",
                         "attnaudit.json")
WAIT_S = 180          # bound of every wait
WINDOW = "10m"        # rate windows: longer than the whole run
MODEL, LAYER = "llama3-8b", "0"

PASSED = 0
FAILED = 0


def check(ok, what, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print("PASS  " + what)
    else:
        FAILED += 1
        print("FAIL  " + what + (": " + detail if detail else ""))
    return ok


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what, timeout=WAIT_S, step=0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(step)
    raise RuntimeError("timed out waiting for %s (last: %r)" % (what, last))


def run(cmd, want=(0,), timeout=120):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout)
    if p.returncode not in want:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(cmd), p.returncode,
                                                p.stdout[-2000:],
                                                p.stderr[-2000:]))
    return p


# ---- the processes ---------------------------------------------------------

class Server:
    def __init__(self, binary, work):
        self.log_path = os.path.join(work, "server.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--metrics-listen",
             "127.0.0.1:0", "--data-dir", os.path.join(work, "data"),
             "--cpu-workers", "1", "--threads-per-job", "1",
             "--drain-timeout", "10s"],
            stdout=subprocess.DEVNULL, stderr=self.log)

        def ports():
            if self.proc.poll() is not None:
                raise RuntimeError("attnaudit-server exited at start")
            text = open(self.log_path).read()
            g = re.search(r'msg="grpc listening" addr=127\.0\.0\.1:(\d+)', text)
            m = re.search(r'msg="metrics listening" addr=127\.0\.0\.1:(\d+)',
                          text)
            return (g.group(1), m.group(1)) if g and m else None
        self.grpc_port, self.metrics_port = wait_for(ports, "server ports")
        self.addr = "127.0.0.1:" + self.grpc_port

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Prometheus:
    def __init__(self, binary, work, metrics_port):
        self.work = work
        dead_port = free_port()  # nothing listens there
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n"
                "  - job_name: attnaudit\n    static_configs:\n"
                "      - targets: ['127.0.0.1:%s']\n"
                "  - job_name: other-service\n    static_configs:\n"
                "      - targets: ['127.0.0.1:%d']\n" % (metrics_port,
                                                         dead_port))
        self.log = open(os.path.join(work, "prometheus.log"), "w")
        for attempt in range(3):  # the free port may be taken meanwhile
            self.port = free_port()
            self.proc = subprocess.Popen(
                [binary, "--config.file=" + config,
                 "--storage.tsdb.path=" + os.path.join(work, "tsdb%d" %
                                                       attempt),
                 "--web.listen-address=127.0.0.1:%d" % self.port,
                 "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=self.log)
            try:
                wait_for(self.ready, "prometheus ready", timeout=60)
                return
            except RuntimeError:
                self.stop()
        raise RuntimeError("prometheus did not start; see " +
                           os.path.join(work, "prometheus.log"))

    def ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError("prometheus exited")
        with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port,
                                    timeout=5) as r:
            return r.status == 200

    def api(self, path, params):
        url = "http://127.0.0.1:%d/api/v1/%s?%s" % (
            self.port, path, urllib.parse.urlencode(params, doseq=True))
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise ValueError("%s: %s" % (path, body))
        return body

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        body = self.api("query", params)
        return body["data"]["result"], body.get("warnings", [])

    def scalar(self, expr):
        result, _ = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- the audits ------------------------------------------------------------

def make_snapshots(cli, work):
    """pass.pb, drift.pb (lse-base2) and invalid.pb (pass.pb with
    sliding_window = -1 appended: Snapshot field 21, last value wins);
    rollout.pb and trainer.pb: pass.pb's tensors as the two sides of a
    train-rollout pair (a consistent one)."""
    paths = {k: os.path.join(work, k + ".pb")
             for k in ("pass", "drift", "invalid", "rollout", "trainer")}
    common = ["--preset", MODEL, "--batch", "1", "--context", "256"]
    run([cli, "synth"] + common + ["-o", paths["pass"]])
    for role in ("rollout", "trainer"):
        run([cli, "synth"] + common + ["--role", role, "--run", "live", "-o",
                                       paths[role]])
    run([cli, "synth"] + common + ["--fault", "lse-base2", "-o",
                                   paths["drift"]])
    shutil.copyfile(paths["pass"], paths["invalid"])
    with open(paths["invalid"], "ab") as f:
        f.write(bytes([0xA8, 0x01]) + b"\xff" * 9 + b"\x01")  # int64 -1
    return paths


def offline_truth(cli, path):
    """{(comparison, quantity): stats} from `check --json`."""
    p = run([cli, "check", "--json", path], want=(0, 1))
    report = json.loads(p.stdout)
    out = {}
    for c in report.get("comparisons", []):
        name = c["comparison"].replace("COMPARISON_", "").lower()
        for q in ("out", "lse", "logprob"):
            if q in c:
                out[(name, q)] = c[q]
    return out


def feed(cli, addr, paths):
    """Phase 2: the audits whose counts the panels must show."""
    a = ["--addr", addr]
    for extra in ([], [], [], ["--stream"]):
        run([cli, "audit", paths["pass"]] + a + extra)
    for _ in range(2):
        run([cli, "audit", paths["drift"]] + a, want=(1,))
    for extra in ([], ["--stream"]):
        p = run([cli, "audit", paths["invalid"]] + a + extra, want=(2,))
        check("invalid" in p.stderr and "sliding_window" in p.stderr,
              "audit %s of an invalid snapshot names the field" %
              (" ".join(extra) or "(unary)"), p.stderr.strip())
    p = run([cli, "submit", paths["invalid"]] + a, want=(2,))
    check("sliding_window" in p.stderr, "submit of an invalid snapshot names "
          "the field", p.stderr.strip())
    for role in ("rollout", "trainer"):
        run([cli, "audit", paths[role]] + a)
    p = run([cli, "submit", paths["pass"], paths["pass"]] + a)
    for line in p.stdout.split("\n"):
        if line.strip():
            job = line.split()[1]
            run([cli, "get", job, "--wait", "120s"] + a, timeout=150)


# ---- Grafana's variables ---------------------------------------------------

INTERVALS = {"$__rate_interval": WINDOW, "${__rate_interval}": WINDOW,
             "$__range": WINDOW, "${__range}": WINDOW,
             "$__interval": "1m", "${__interval}": "1m"}


def regex_all(values):
    """Grafana's regex formatting of a multi-value (or All) selection."""
    escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", v) for v in values]
    return "(" + "|".join(escaped) + ")"


def substitute(expr, variables):
    for k, v in INTERVALS.items():
        expr = expr.replace(k, v)
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${%s}" % name, variables[name])
        expr = expr.replace("$" + name, variables[name])
    return expr


def label_values(prom, query, variables):
    """label_values(METRIC{SEL}, LABEL) through the label values API."""
    m = re.match(r"label_values\((.*),\s*(\w+)\)$", query.strip())
    selector, label = substitute(m.group(1), variables), m.group(2)
    body = prom.api("label/%s/values" % label, {"match[]": selector})
    return body["data"]


def resolve_variables(prom, dashboard, found_values):
    """The value each variable has with its default selection; the values
    each query variable found go to found_values[name]."""
    variables = {}
    for v in dashboard["templating"]["list"]:
        name = v["name"]
        if v["type"] == "datasource":
            continue
        current = v.get("current", {}).get("value")
        current = current if isinstance(current, list) else [current]
        if v["type"] == "query":
            found = label_values(prom, v["query"], variables)
            found_values[name] = found
            if "$__all" in current:
                all_value = v.get("allValue")
                variables[name] = all_value if all_value else regex_all(found)
            else:
                variables[name] = regex_all(current)
        else:  # custom
            if "$__all" in current:
                variables[name] = v.get("allValue") or ".*"
            else:
                variables[name] = (current[0] if len(current) == 1
                                   else regex_all(current))
    return variables


# ---- expectations ----------------------------------------------------------

def bucket_bounds(prom, family):
    """The finite `le` bounds of a drift family, from the scrape."""
    result, _ = prom.query('%s_bucket{job="attnaudit"}' % family)
    return sorted({float(r["metric"]["le"]) for r in result
                   if r["metric"]["le"] != "+Inf"})


def bucket_range(bounds, values):
    """(lower bound of the smallest value's bucket, upper bound of the
    largest value's bucket): where any quantile of `values` must land."""
    def upper(v):
        for b in bounds:
            if v <= b:
                return b
        return bounds[-1]  # the +Inf bucket: histogram_quantile's cap

    def lower(v):
        below = [b for b in bounds if b < v]
        return below[-1] if below else 0.0
    return lower(min(values)), upper(max(values))


def series_values(result):
    return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1])
            for r in result}


def by_label(result, label):
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


class Expect:
    """Per panel title: a function(results, ctx) -> list of (ok, detail),
    one entry per check; results[i] is the i-th target's result vector."""


def close(a, b, rel=1e-9):
    return a is not None and abs(a - b) <= rel * max(1.0, abs(b))


def build_expectations(ctx):
    c = ctx["counts"]
    total = sum(c.values())
    valid = c["PASS"] + c["DRIFT"]

    def single(results):
        r = results[0]
        return float(r[0]["value"][1]) if len(r) == 1 else None

    def positive(results):
        return [(all(len(r) > 0 for r in results), "every target has data"),
                (all(float(s["value"][1]) > 0 for s in results[0]),
                 "positive")]

    def finite_nonneg(results):
        checks = [(all(len(r) > 0 for r in results), "every target has data")]
        for r in results:
            for s in r:
                v = float(s["value"][1])
                checks.append((math.isfinite(v) and v >= 0,
                               "%s = %r finite and >= 0" % (s["metric"], v)))
        return checks

    def quantile_in(family, comparison, quantity):
        def f(results):
            lo, hi = bucket_range(ctx["bounds"][family],
                                  ctx["truth"][(comparison, quantity)])
            checks = [(len(results[0]) == 1, "one (model, layer) series")]
            for r in results:
                for s in r:
                    v = float(s["value"][1])
                    checks.append((lo <= v <= hi,
                                   "%g in the buckets of the observed values "
                                   "[%g, %g]" % (v, lo, hi)))
            return checks
        return f

    def verdict_ratios(results):
        v = by_label(results[0], "verdict")
        # INCONCLUSIVE's series exist from the start; this traffic has none.
        return [(set(v) == {"PASS", "DRIFT", "INVALID", "INCONCLUSIVE"},
                 "four verdicts"),
                (v.get("INCONCLUSIVE") == 0, "INCONCLUSIVE 0"),
                (close(v.get("DRIFT", 0) / v.get("PASS", 1),
                       c["DRIFT"] / c["PASS"]), "DRIFT/PASS = %d/%d" %
                 (c["DRIFT"], c["PASS"])),
                (close(v.get("INVALID", 0) / v.get("PASS", 1),
                       c["INVALID"] / c["PASS"]), "INVALID/PASS = %d/%d" %
                 (c["INVALID"], c["PASS"]))]

    def rejections(results):
        v = by_label(results[0], "reason")
        others = {k: x for k, x in v.items() if k != "invalid_argument"}
        return [(v.get("invalid_argument", 0) > 0,
                 "invalid_argument > 0 (invalid input on every RPC)"),
                (all(x == 0 for x in others.values()),
                 "no other reason: %r" % others)]

    def queues(results):
        depth, capacity = by_label(results[0], "class"), by_label(
            results[1], "class")
        return [(depth == {"interactive": 0, "sampled": 0}, "depth 0: %r" %
                 depth),
                (capacity == {"interactive": 64, "sampled": 1024},
                 "capacity 64/1024: %r" % capacity)]

    def inflight(results):
        return [(single([results[0]]) == 0, "in-flight 0"),
                (by_label(results[1], "kind") == {"cpu": 1}, "one cpu device")]

    def comparison_fractions(results):
        # engine_vs_emulation never ran here (no 16-bit-score engine): its
        # fraction is 0/0, NaN, and left out.
        v = {k: x for k, x in by_label(results[0], "comparison").items()
             if not math.isnan(x)}
        want = {"engine_vs_reference": c["DRIFT"] / valid,
                "replay_vs_reference": 0.0,
                "engine_vs_replay": c["DRIFT"] / valid}
        return [(set(v) == set(want), "three comparisons")] + [
            (close(v.get(k), x), "%s = %g (got %r)" % (k, x, v.get(k)))
            for k, x in want.items()]

    def layer_fractions(results):
        v = series_values(results[0])
        want = json.dumps({"layer": LAYER, "model": MODEL}, sort_keys=True)
        # The series of a (model, layer) start at its first audit (a PASS:
        # the clean audits come first), which rate() counts only partly
        # (its extrapolation stops at a zero start, not at a start of 1):
        # the fraction lies between DRIFT/valid and DRIFT/(valid - 1).
        got = v.get(want)
        lo, hi = c["DRIFT"] / valid, c["DRIFT"] / (valid - 1)
        return [(list(v) == [want], "one (model, layer) series: %r" % list(v)),
                (got is not None and lo * (1 - 1e-9) <= got <= hi * (1 + 1e-9),
                 "in [%d/%d, %d/%d], got %r" % (c["DRIFT"], valid, c["DRIFT"],
                                               valid - 1, got))]

    def diagnoses(results):
        # The drifting audits are lse-base2 snapshots: the diagnosis
        # names the base.
        v = by_label(results[0], "hypothesis")
        return [(set(v) == {"lse-base"}, "only lse-base: %r" % v),
                (all(x > 0 for x in v.values()), "positive")]

    def no_checks_drift(results):
        checks = [(all(len(r) > 0 for r in results), "every target has data")]
        for r in results:
            checks += [(float(s["value"][1]) == 0, "%s = 0" % s["metric"])
                       for s in r]
        return checks

    def no_pair_drift(results):
        checks = [(all(len(r) > 0 for r in results), "every target has data")]
        checks += [(s["metric"].get("layer") == LAYER and
                    float(s["value"][1]) == 0, "%s = 0" % s["metric"])
                   for s in results[0]]
        return checks

    def pair_sides(results):
        v = by_label(results[0], "outcome")
        return [(v.get("waiting", 0) > 0, "waiting > 0 (the first side)"),
                (v.get("joined", 0) > 0, "joined > 0 (the second)"),
                (v.get("dropped", 0) == 0, "dropped 0"),
                (v.get("failed", 0) == 0, "failed 0")]

    def outcomes(results):
        v = by_label(results[0], "outcome")
        return [(v.get("ok", 0) > 0, "ok > 0"),
                (v.get("failed", 0) == 0, "failed 0")]

    def devices(results):
        v = {(s["metric"]["kind"], s["metric"]["state"]): float(s["value"][1])
             for s in results[0]}
        return [(v == {("cpu", "idle"): 1, ("cpu", "busy"): 0,
                       ("cpu", "failed"): 0},
                 "cpu idle 1, busy 0, failed 0: %r" % v)]

    def build_info(results):
        r = results[0]
        return [(len(r) == 1 and r[0]["metric"].get("version") ==
                 ctx["version"] and float(r[0]["value"][1]) == 1,
                 "one replica, version %s" % ctx["version"])]

    return {
        "DRIFT fraction (10m)": lambda r: [(close(single(r), c["DRIFT"] /
                                                  valid),
                                            "%d/%d, got %r" % (
                                                c["DRIFT"], valid,
                                                single(r)))],
        "INVALID fraction (10m)": lambda r: [(close(single(r), c["INVALID"] /
                                                    total),
                                              "%d/%d, got %r" % (
                                                  c["INVALID"], total,
                                                  single(r)))],
        "INCONCLUSIVE fraction (10m)": lambda r: [
            (single(r) == 0, "0 (no inconclusive audit), got %r" % single(r))],
        "Overridden (10m)": lambda r: [
            (single(r) == 0, "0 (no override), got %r" % single(r))],
        "Audits/s": positive,
        "Rejected/s": positive,
        "Fullest queue": lambda r: [(single(r) == 0, "0, got %r" % single(r))],
        "Targets down": lambda r: [(single(r) == 0,
                                    "0 although other-service is down, got "
                                    "%r" % single(r))],
        "Audits/s by verdict": verdict_ratios,
        "Rejections/s by reason": rejections,
        "Queue depth by class": queues,
        "In-flight jobs and devices": inflight,
        "Attention output max |diff| by model/layer": quantile_in(
            "attnaudit_drift_out_max_abs", "engine_vs_reference", "out"),
        "Attention output max ULP distance (p99)": quantile_in(
            "attnaudit_drift_out_max_ulp", "engine_vs_reference", "out_ulp"),
        "LSE max |diff| by model/layer": quantile_in(
            "attnaudit_drift_lse_max_abs", "engine_vs_reference", "lse"),
        "Log-prob max |diff| by model/layer": quantile_in(
            "attnaudit_drift_logprob_abs_diff", "engine_vs_reference",
            "logprob"),
        "DRIFT fraction by comparison": comparison_fractions,
        "DRIFT fraction by model/layer": layer_fractions,
        "Diagnoses over the range": diagnoses,
        "Context-parallel and RoPE checks drifting/s": no_checks_drift,
        "Worst model/layer: output max |diff| p99 over the range":
            quantile_in("attnaudit_drift_out_max_abs", "engine_vs_reference",
                        "out"),
        "Queue wait by class": finite_nonneg,
        "Stage duration by stage": finite_nonneg,
        "Device run time per job": finite_nonneg,
        "Jobs finished/s by outcome": outcomes,
        "Devices by kind and state": devices,
        "Queued bytes (memory budget use)": lambda r: [
            (single(r) == 0, "0, got %r" % single(r))],
        "Received bytes/s": positive,
        "Build info": build_info,
        # One server on its SQLite store, answering all along.
        "Job store up": lambda r: [(single(r) == 1, "1, got %r" % single(r))],
        # No fleet here: nothing taken over.
        "Fleet jobs taken over": lambda r: [
            (single(r) == 0, "0, got %r" % single(r))],
        # One consistent pair (rollout.pb, trainer.pb): nothing beyond noise.
        "train\u2013rollout attention by layer": no_pair_drift,
        "Pair sides by outcome/s": pair_sides,
    }


def panels(dashboard):
    out = []

    def walk(ps):
        for p in ps:
            if p.get("type") == "row":
                walk(p.get("panels", []))
            else:
                out.append(p)
    walk(dashboard["panels"])
    return out


# ---- main ------------------------------------------------------------------

def truth_values(truth_pass, truth_drift, counts_by_file):
    """(comparison, quantity) -> the max |diff| values the phase-2 audits
    observed (ULP under "out_ulp")."""
    values = {}
    for truth, n in ((truth_pass, counts_by_file["pass"]),
                     (truth_drift, counts_by_file["drift"])):
        for (comparison, q), stats in truth.items():
            values.setdefault((comparison, q), []).extend(
                [float(stats.get("max_abs", 0))] * n)
            if q == "out":
                values.setdefault((comparison, "out_ulp"), []).extend(
                    [float(stats.get("max_ulp", 0))] * n)
    return values


def run_checks(args, work):
    dashboard = json.load(open(DASHBOARD, encoding="utf-8"))
    paths = make_snapshots(args.cli, work)
    truth_pass = offline_truth(args.cli, paths["pass"])
    truth_drift = offline_truth(args.cli, paths["drift"])
    server = Server(args.server, work)
    prom = None
    try:
        prom = Prometheus(args.prometheus, work, server.metrics_port)
        # Counters must be scraped at zero before the first audit.
        wait_for(lambda: (prom.scalar('count_over_time(up{job="attnaudit"}'
                                      '[1m])') or 0) >= 2 and
                 prom.scalar('up{job="attnaudit"}') == 1,
                 "two scrapes of the server")
        caps = run([args.cli, "caps", "--json", "--addr", server.addr])
        version = json.loads(caps.stdout)["version"]
        # Phase 1 creates the (model, layer) drift series; rate() counts from
        # their first scrape, so phase 2 starts once Prometheus has them.
        run([args.cli, "audit", paths["pass"], "--addr", server.addr])
        wait_for(lambda: prom.query('attnaudit_drift_out_max_abs_count{job='
                                    '"attnaudit",model="%s"}' % MODEL)[0],
                 "the drift series in Prometheus")
        feed(args.cli, server.addr, paths)
        counts = {"PASS": 9, "DRIFT": 2, "INVALID": 3}  # see feed()
        for verdict, n in counts.items():
            wait_for(lambda v=verdict, n=n: prom.scalar(
                'attnaudit_audits_total{job="attnaudit",verdict="%s"}' % v)
                == n, "audits_total{verdict=%s} == %d in Prometheus" %
                (verdict, n))
        wait_for(lambda: prom.scalar(
            'sum(attnaudit_jobs_completed_total{job="attnaudit"})') ==
            counts["PASS"] + counts["DRIFT"] + 2 and prom.scalar(
            'attnaudit_inflight_jobs{job="attnaudit"}') == 0,
            "every job finished in Prometheus")
        wait_for(lambda: prom.scalar(
            'sum(attnaudit_pair_verdicts_total{job="attnaudit"})') == 1,
            "the pair's one row in Prometheus")
        time.sleep(2.5)  # one more scrape of the final gauges
        check(prom.scalar('count(up == 0)') == 1,
              "the shared Prometheus has a down target of another job "
              "(what the job filter must ignore)")

        found = {}
        variables = resolve_variables(prom, dashboard, found)
        check(found["job"] == ["attnaudit"],
              "job variable lists only attnaudit jobs", repr(found["job"]))
        check(MODEL in found["model"] and LAYER in found["layer"],
              "model/layer variables find the audited series")
        ctx = {"counts": counts, "version": version,
               "truth": truth_values(truth_pass, truth_drift,
                                     {"pass": 8, "drift": 2}),
               "bounds": {f: bucket_bounds(prom, f) for f in (
                   "attnaudit_drift_out_max_abs", "attnaudit_drift_out_max_ulp",
                   "attnaudit_drift_lse_max_abs",
                   "attnaudit_drift_logprob_abs_diff")}}
        expectations = build_expectations(ctx)
        at = time.time()
        for panel in panels(dashboard):
            title = panel["title"]
            if not check(title in expectations, "panel %r has an expectation"
                         % title):
                continue
            results, problems = [], []
            for t in panel["targets"]:
                expr = substitute(t["expr"], variables)
                try:
                    result, warnings = prom.query(expr, at)
                except (OSError, ValueError) as e:
                    problems.append("%s: %s" % (expr, e))
                    result, warnings = [], []
                if warnings:
                    problems.append("%s: warnings %r" % (expr, warnings))
                if not result:
                    problems.append("%s: no data" % expr)
                results.append(result)
            check(not problems, "%s: every query evaluates with data" % title,
                  "; ".join(problems))
            if problems:
                continue
            for ok, detail in expectations[title](results):
                check(ok, "%s: %s" % (title, detail))
    finally:
        if prom is not None:
            prom.stop()
        server.stop()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--keep", help="keep the work folder here")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="attnaudit_panels_")
    os.makedirs(work, exist_ok=True)
    try:
        run_checks(args, work)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        check(False, "the test ran to the end", str(e))
        for log in ("server.log", "prometheus.log"):
            path = os.path.join(work, log)
            if os.path.exists(path):
                print("--- %s (last lines)" % log)
                print("".join(open(path).readlines()[-20:]))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
