#!/usr/bin/env python3
"""Generates the Grafana dashboards under deploy/grafana/dashboards/:
attnaudit.json (the on-call dashboard, Prometheus) and attnaudit-store.json
(the audits of a fleet's PostgreSQL store, one row per job).

    python3 deploy/grafana/dashboard_gen.py          # rewrite both JSONs
    python3 deploy/grafana/dashboard_gen.py --check  # exit 1 if one is stale
    python3 deploy/grafana/dashboard_gen.py --help   # these options

The JSON is committed (Grafana provisions it as-is); edit this file, not the
JSON. Standard library only. tests/deploy/check_deploy.sh runs --check and
lints every PromQL expression against server/metrics/metrics.h;
tests/deploy/store_panels_test.py runs every SQL panel against a
PostgreSQL holding known rows.

attnaudit.json, top to bottom (what you need first at 3 a.m. is at the top):
  Overview   DRIFT / INVALID fraction, audits/s, rejections/s, queue fill,
             targets down; verdicts, rejections by reason, queue depth,
             in-flight and devices over time
  Drift      output |diff| p50/p99 and ULP p99 by model/layer, LSE and
             log-prob |diff|, DRIFT fraction by comparison, worst layers
  Pairs      train-rollout attention by layer (pair verdicts beyond
             noise), pair sides by outcome
  Latency    queue wait by class, stage durations, device run time, outcomes
  Devices    device state, queued bytes, received bytes, build info
Every panel uses the `datasource` variable (default: the provisioned uid
attnaudit-prometheus) and the job / instance / comparison / model / layer
variables. The job variable lists only jobs that export attnaudit metrics
(label_values(attnaudit_build_info, job)) and its "All" is those jobs, never
".*": on a Prometheus shared with other services, `up{job=~"$job"}` must not
count their targets.

Future panels (once the server reports them): context-parallel ranks (per
rank drift of the merged partial states). Diagnoses are not metrics: the
store dashboard shows them from the job rows.

attnaudit-store.json reads the table attnaudit_jobs of `--store
postgresql://...` through the datasource uid attnaudit-store
(provisioning/datasources/attnaudit-store.yml), terminal rows only (state
DONE, FAILED or CANCELLED), filtered by the `tenant` and `model` variables:
  Latest DRIFT audits, DRIFT by layer over time, DRIFT by layer over steps,
  Verdicts per replica, Diagnoses (last 24h).
Grafana expands its SQL macros with a regex whose argument stops at the
first ")": `$__timeFilter(to_timestamp(finished_us / 1e6))` would become
`to_timestamp(finished_us / 1e6 BETWEEN ... )`. So every panel reads a
subquery that names the timestamp (`finished`) and passes the bare column.
"""
import argparse
import json
import os
import sys

DATASOURCE_UID = "attnaudit-prometheus"
DS = {"type": "prometheus", "uid": "${datasource}"}
DASHBOARDS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "dashboards")
OUT = os.path.join(DASHBOARDS, "attnaudit.json")
OUT_STORE = os.path.join(DASHBOARDS, "attnaudit-store.json")

# The store dashboard's datasource: Grafana's core PostgreSQL plugin (its id
# since Grafana 10.3; "postgres" is an alias) and the provisioned uid.
STORE_DS_TYPE = "grafana-postgresql-datasource"
STORE_DS_UID = "attnaudit-store"
STORE_DS = {"type": STORE_DS_TYPE, "uid": "${datasource}"}

# Label matchers shared by every query.
SEL = 'job=~"$job",instance=~"$instance"'
DRIFT_SEL = SEL + ',comparison=~"$comparison",model=~"$model",layer=~"$layer"'
RATE = "$__rate_interval"


class Layout:
    """Hands out gridPos rectangles left to right, row by row (24 columns)."""

    def __init__(self):
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def id(self):
        self.next_id += 1
        return self.next_id - 1

    def place(self, w, h):
        if self.x + w > 24:
            self.newline()
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def newline(self):
        self.y += self.row_h
        self.x = 0
        self.row_h = 0


L = Layout()
PANELS = []


def target(expr, legend="", ref="A", instant=False):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t.update({"instant": True, "range": False})
    else:
        t.update({"instant": False, "range": True})
    return t


def row(title):
    L.newline()
    PANELS.append({"type": "row", "title": title, "collapsed": False,
                   "id": L.id(), "gridPos": L.place(24, 1), "panels": []})
    L.newline()


def thresholds(*steps):
    """steps: (value, color) after the base green."""
    s = [{"color": "green", "value": None}]
    s += [{"color": c, "value": v} for v, c in steps]
    return {"mode": "absolute", "steps": s}


def stat(title, description, expr, unit, w=4, h=4, steps=(), decimals=None):
    defaults = {"unit": unit, "thresholds": thresholds(*steps),
                "color": {"mode": "thresholds"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    PANELS.append({
        "type": "stat", "title": title, "description": description,
        "id": L.id(), "gridPos": L.place(w, h), "datasource": DS,
        "targets": [target(expr)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"],
                                      "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "area",
                    "justifyMode": "auto", "orientation": "auto",
                    "textMode": "value"},
    })


def timeseries(title, description, targets, unit, w=12, h=8, log=None,
               stack=False, overrides=None, steps=(), min_zero=True):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
              "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none",
                           "group": "A"}}
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": log}
    if steps:
        custom["thresholdsStyle"] = {"mode": "line+area"}
    defaults = {"unit": unit, "custom": custom,
                "thresholds": thresholds(*steps),
                "color": {"mode": "palette-classic"}}
    if min_zero and not log:
        defaults["min"] = 0
    PANELS.append({
        "type": "timeseries", "title": title, "description": description,
        "id": L.id(), "gridPos": L.place(w, h), "datasource": DS,
        "targets": [target(e, lg, chr(ord("A") + i))
                    for i, (e, lg) in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"],
                               "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    })


def color_override(name, color):
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": "color",
                            "value": {"mode": "fixed", "fixedColor": color}}]}


def quantiles(metric, by, sel, legend, qs=(0.5, 0.99)):
    """histogram_quantile targets over a classic histogram."""
    out = []
    for q in qs:
        expr = ("histogram_quantile(%g, sum by (%s, le) "
                "(rate(%s_bucket{%s}[%s])))" % (q, by, metric, sel, RATE))
        out.append((expr, "p%d %s" % (round(q * 100), legend)))
    return out


def _overview_verdicts():
    """The Overview row and its verdict shares."""
    # ---------------------------------------------------------- Overview ----
    row("Overview")
    stat("DRIFT fraction (10m)",
         "Share of valid audits (PASS + DRIFT + INCONCLUSIVE) whose verdict "
         "is DRIFT over the last 10 minutes, all selected replicas. Same "
         "window and threshold (5%) as the AttnauditDriftRateHigh alert. A "
         "rise means an inference engine's attention moved beyond tolerance: "
         "look at the Drift row below for which comparison, model and layer.",
         'sum(rate(attnaudit_audits_total{%s,verdict="DRIFT"}[10m])) / '
         'sum(rate(attnaudit_audits_total{%s,verdict=~"PASS|DRIFT|'
         'INCONCLUSIVE"}[10m]))' % (SEL, SEL),
         "percentunit", steps=((0.01, "orange"), (0.05, "red")), decimals=2)
    stat("INCONCLUSIVE fraction (10m)",
         "Share of valid audits that found nothing wrong but could not verify "
         "what a PASS promises (verdict INCONCLUSIVE): scores beyond what "
         "fp32 orders, or a tolerance (an undeclared engine's, a pre-RoPE "
         "snapshot's without the engine's RoPE table, an override) wide "
         "enough to pass an all-zero output. Above 20% for 30 minutes fires "
         "AttnauditInconclusiveRateHigh: `attnaudit get <job>` prints the "
         "reasons and what to send.",
         'sum(rate(attnaudit_audits_total{%s,verdict="INCONCLUSIVE"}[10m])) / '
         'sum(rate(attnaudit_audits_total{%s,verdict=~"PASS|DRIFT|'
         'INCONCLUSIVE"}[10m]))' % (SEL, SEL),
         "percentunit", steps=((0.05, "orange"), (0.2, "red")), decimals=2)
    stat("Overridden (10m)",
         "Share of audits whose request departed from the verdict policy "
         "(tolerance overrides, the statistical test off, precision fields "
         "past every profile's range; needs the override permission). Their "
         "PASS is the client's word, not the policy's: `attnaudit list "
         "--json` shows the overrides of each.",
         'sum(rate(attnaudit_audits_total{%s,overridden="true"}[10m])) / '
         'sum(rate(attnaudit_audits_total{%s}[10m]))' % (SEL, SEL),
         "percentunit", steps=((0.01, "orange"),), decimals=2)
    stat("INVALID fraction (10m)",
         "Share of all audits whose snapshot failed validation (verdict "
         "INVALID) over 10 minutes; alert at 5%. Usually a snapshot exporter "
         "bug after an engine upgrade: `attnaudit watch --verdict INVALID "
         "--json` shows the field path of the error.",
         'sum(rate(attnaudit_audits_total{%s,verdict="INVALID"}[10m])) / '
         'sum(rate(attnaudit_audits_total{%s}[10m]))' % (SEL, SEL),
         "percentunit", steps=((0.01, "orange"), (0.05, "red")), decimals=2)


def _overview_traffic():
    """The Overview row's traffic, queue and target stats."""
    stat("Audits/s",
         "Audits finished per second (any verdict), all selected replicas. "
         "Zero while replicas are up for 30 minutes fires AttnauditNoAudits: "
         "traffic stopped reaching the service.",
         "sum(rate(attnaudit_audits_total{%s}[%s]))" % (SEL, RATE), "ops",
         decimals=2)
    stat("Rejected/s",
         "Requests refused per second, all reasons except draining "
         "(expected during rollouts). See 'Rejections/s by reason'.",
         'sum(rate(attnaudit_rejections_total{%s,reason!="draining"}[%s]))'
         % (SEL, RATE), "reqps", steps=((0.01, "orange"), (0.1, "red")),
         decimals=2)
    stat("Fullest queue",
         "Highest queue depth / capacity over all replicas and classes. "
         "Above 80% for 5 minutes fires AttnauditQueueSaturated; at 100% "
         "requests get RESOURCE_EXHAUSTED.",
         "max(attnaudit_queue_depth{%s} / on (job, instance, class) "
         "(attnaudit_queue_capacity{%s} > 0))" % (SEL, SEL),
         "percentunit", steps=((0.5, "orange"), (0.8, "red")), decimals=1)
    stat("Targets down",
         "Scrape targets of the selected attnaudit jobs/instances that "
         "Prometheus cannot reach (up == 0); other services' targets on a "
         "shared Prometheus are not counted. Any non-zero value for 2 minutes "
         "fires AttnauditDown.",
         'count(up{job=~"$job",instance=~"$instance"} == 0) or vector(0)',
         "none", steps=((1, "red"),), decimals=0)
    L.newline()


def _overview_timeseries():
    """The Overview row's time series: verdicts, rejections, queues, devices."""
    timeseries(
        "Audits/s by verdict",
        "Finished audits per second by verdict (stacked). PASS green, DRIFT "
        "orange, INVALID red, INCONCLUSIVE purple.",
        [("sum by (verdict) (rate(attnaudit_audits_total{%s}[%s]))"
          % (SEL, RATE), "{{verdict}}")],
        "ops", w=6, stack=True,
        overrides=[color_override("PASS", "green"),
                   color_override("DRIFT", "orange"),
                   color_override("INVALID", "red"),
                   color_override("INCONCLUSIVE", "purple")])
    timeseries(
        "Rejections/s by reason",
        "Requests refused at admission, by reason. queue_full / "
        "memory_budget: out of capacity (scale out). invalid_argument / "
        "too_large: client problem. deadline / cancelled: clients gave up "
        "before admission. draining: a replica is shutting down (normal "
        "during rollouts).",
        [("sum by (reason) (rate(attnaudit_rejections_total{%s}[%s]))"
          % (SEL, RATE), "{{reason}}")],
        "reqps", w=6)
    timeseries(
        "Queue depth by class",
        "Jobs waiting for a device, per priority class, summed over "
        "replicas (dashed: capacity). interactive = Audit/AuditStream, "
        "sampled = Submit. Compare instances (variable) to spot a replica "
        "that gets all the traffic.",
        [("sum by (class) (attnaudit_queue_depth{%s})" % SEL,
          "{{class}} depth"),
         ("sum by (class) (attnaudit_queue_capacity{%s})" % SEL,
          "{{class}} capacity")],
        "short", w=6,
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*capacity"},
                    "properties": [{"id": "custom.lineStyle",
                                    "value": {"fill": "dash",
                                              "dash": [10, 10]}}]}])
    timeseries(
        "In-flight jobs and devices",
        "Jobs running on a device now, and the device pool size by kind. "
        "In-flight pinned at the pool size with a growing queue = saturated; "
        "in-flight stuck > 0 with no audits finishing = hung jobs.",
        [("sum(attnaudit_inflight_jobs{%s})" % SEL, "in-flight"),
         ("sum by (kind) (attnaudit_devices{%s})" % SEL, "{{kind}} devices")],
        "short", w=6)


def _drift_quantiles():
    """The Drift row's quantiles of the drift histograms."""
    # ------------------------------------------------------------- Drift ----
    row("Drift ($comparison)")
    timeseries(
        "Attention output max |diff| by model/layer",
        "p50 and p99 over audits of the largest |candidate - baseline| of the "
        "attention output (per audit), by model and layer, for the selected "
        "comparison (default engine_vs_reference = engine drift). bf16 "
        "kernels usually sit around 1e-3; a step up by a decade at one "
        "layer points at that layer's kernel path.",
        quantiles("attnaudit_drift_out_max_abs", "model, layer", DRIFT_SEL,
                  "{{model}} L{{layer}}"),
        "sci", log=10)
    timeseries(
        "Attention output max ULP distance (p99)",
        "p99 of the largest ULP distance of the attention output (in the "
        "output dtype). 0 = bit-exact; a few ULP is rounding; thousands "
        "means a wrong value, not rounding.",
        quantiles("attnaudit_drift_out_max_ulp", "model, layer", DRIFT_SEL,
                  "{{model}} L{{layer}}", qs=(0.99,)),
        "none", log=2)
    timeseries(
        "LSE max |diff| by model/layer",
        "p50 and p99 of the largest |candidate - baseline| of the "
        "log-sum-exp (natural log). A constant offset near ln 2 = 0.693 "
        "suggests a log2-vs-ln mix-up; large LSE drift with small output "
        "drift suggests a split-KV/merge bug.",
        quantiles("attnaudit_drift_lse_max_abs", "model, layer", DRIFT_SEL,
                  "{{model}} L{{layer}}"),
        "sci", log=10)
    timeseries(
        "Log-prob max |diff| by model/layer",
        "p50 and p99 of the largest |candidate - baseline| of the selected "
        "tokens' log-probs: the RL-visible effect of the attention drift.",
        quantiles("attnaudit_drift_logprob_abs_diff", "model, layer",
                  DRIFT_SEL, "{{model}} L{{layer}}"),
        "sci", log=10)


def _drift_fractions():
    """The Drift row's DRIFT shares by comparison and by model/layer."""
    timeseries(
        "DRIFT fraction by comparison",
        "Share of comparisons with verdict DRIFT, per comparison. "
        "engine_vs_reference only: the engine drifts. replay_vs_reference "
        "too: the replayed paged/CP execution itself differs from the "
        "reference (merge, split, CP path). engine_vs_replay: the engine "
        "differs from its own deterministic replay (nondeterminism, order).",
        [('sum by (comparison) (rate(attnaudit_comparison_verdicts_total'
          '{%s,verdict="DRIFT"}[%s])) / sum by (comparison) '
          '(rate(attnaudit_comparison_verdicts_total{%s}[%s]))'
          % (SEL, RATE, SEL, RATE), "{{comparison}}")],
        "percentunit", steps=((0.05, "red"),))
    timeseries(
        "DRIFT fraction by model/layer",
        "Share of audits with verdict DRIFT, per model and layer (the "
        "engine's verdict, any comparison). One layer drifting alone points "
        "at that layer's kernel path or config (window, soft-cap, RoPE); "
        "every layer at once at something shared (page table, scale, "
        "precision). Layers past the server's --metrics-max-layers show as "
        "'other'.",
        [('sum by (model, layer) (rate(attnaudit_layer_audits_total'
          '{%s,verdict="DRIFT"}[%s])) / sum by (model, layer) '
          '(rate(attnaudit_layer_audits_total{%s}[%s]))'
          % (SEL, RATE, SEL, RATE), "{{model}} L{{layer}}")],
        "percentunit", steps=((0.05, "red"),))


def _drift_rankings():
    """The Drift row's rankings: worst model/layer, diagnoses."""
    PANELS.append({
        "type": "bargauge",
        "title": "Worst model/layer: output max |diff| p99 over the range",
        "description": "The ten (model, layer) pairs with the highest p99 "
                       "attention-output drift over the dashboard's time "
                       "range, selected comparison. Start the investigation "
                       "with the top bar.",
        "id": L.id(), "gridPos": L.place(12, 8), "datasource": DS,
        "targets": [target(
            "topk(10, histogram_quantile(0.99, sum by (model, layer, le) "
            "(increase(attnaudit_drift_out_max_abs_bucket{%s}[$__range]))))"
            % DRIFT_SEL, "{{model}} L{{layer}}", instant=True)],
        "fieldConfig": {"defaults": {
            "unit": "sci", "min": 0,
            "thresholds": thresholds((0.01, "orange"), (0.1, "red")),
            "color": {"mode": "thresholds"}}, "overrides": []},
        "options": {"orientation": "horizontal", "displayMode": "basic",
                    "showUnfilled": True,
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                      "values": False}},
    })

    PANELS.append({
        "type": "bargauge",
        "title": "Diagnoses over the range",
        "description": "Drifting audits by the hypothesis their diagnosis "
                       "ranked first (docs/DIAGNOSIS.md), over the "
                       "dashboard's time range: what most likely went wrong. "
                       "'unexplained' means no known failure fits; the "
                       "report's localisation and the store dashboard have "
                       "the details.",
        "id": L.id(), "gridPos": L.place(12, 8), "datasource": DS,
        "targets": [target(
            "topk(10, sum by (hypothesis) (increase(attnaudit_diagnoses_total"
            "{%s}[$__range])) > 0)" % SEL, "{{hypothesis}}", instant=True)],
        "fieldConfig": {"defaults": {
            "unit": "none", "min": 0, "decimals": 0,
            "thresholds": thresholds(),
            "color": {"mode": "fixed", "fixedColor": "orange"}},
            "overrides": []},
        "options": {"orientation": "horizontal", "displayMode": "basic",
                    "showUnfilled": True,
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                      "values": False}},
    })


def _check_drifts():
    """The Drift row's context-parallel and RoPE checks."""
    timeseries(
        "Context-parallel and RoPE checks drifting/s",
        "DRIFT verdicts per second of the context-parallel checks (rank: "
        "one rank's own partial was wrong; combine: the engine's combine; "
        "engine_order / deterministic: the merge order) and of the RoPE "
        "checks (q, k: the rolling check of this step's rotation; table: "
        "the engine's RoPE table). Zero when the fleet sends no CP or "
        "pre-RoPE snapshots.",
        [('sum by (check) (rate(attnaudit_cp_checks_total'
          '{%s,verdict="DRIFT"}[%s]))' % (SEL, RATE), "cp {{check}}"),
         ('sum by (check) (rate(attnaudit_rope_checks_total'
          '{%s,verdict="DRIFT"}[%s]))' % (SEL, RATE), "rope {{check}}")],
        "ops")


def _pairs():
    """The train-rollout pairs row (server/pairs joins them)."""
    # ------------------------------------------------------------- Pairs ----
    row("Train-rollout pairs")
    timeseries(
        "train–rollout attention by layer",
        "Row pairs per second whose trainer and rollout attention disagree "
        "beyond both kernels' rounding, by layer and pair verdict "
        "(rollout-drift / trainer-drift / both-drift: that side's own audit "
        "drifts; inputs-differ: q or the newest K/V already differ, so the "
        "divergence entered before attention -- the lowest such layer is "
        "where to look; stale-prefix-kv: a prefix cache filled under older "
        "weights). Zero when every pair is consistent or within noise, or "
        "when no trainer snapshots arrive (see the next panel).",
        [('sum by (layer, verdict) (rate(attnaudit_pair_verdicts_total'
          '{%s,layer=~"$layer",verdict!~"consistent|within-noise"}[%s]))'
          % (SEL, RATE), "L{{layer}} {{verdict}}")],
        "ops", w=12, stack=True,
        overrides=[color_override("inputs-differ", "orange")])
    timeseries(
        "Pair sides by outcome/s",
        "Audited snapshots labelled rollout or trainer, by what became of "
        "them: joined (a counterpart was waiting), waiting (kept in the "
        "store for --pair-wait), dropped (over --pair-max-side-bytes or a "
        "full queue), failed (store or comparison error, in the log). Only "
        "'waiting' for long: the other side never arrives (labels run, "
        "layer, request_ids and role must match).",
        [("sum by (outcome) (rate(attnaudit_pair_sides_total{%s}[%s]))"
          % (SEL, RATE), "{{outcome}}")],
        "ops", w=12, stack=True,
        overrides=[color_override("joined", "green"),
                   color_override("failed", "red")])


def _latency():
    """The Latency row."""
    # ----------------------------------------------------------- Latency ----
    row("Latency")
    timeseries(
        "Queue wait by class",
        "Time from admission until a device took the job, p50 and p99 per "
        "class over all replicas. Alerts: interactive p99 > 2.5 s, sampled "
        "p99 > 30 s.",
        quantiles("attnaudit_queue_wait_seconds", "class", SEL, "{{class}}"),
        "s", w=6)
    timeseries(
        "Stage duration by stage",
        "p50 and p99 time per audit stage (validate, reference, replay, "
        "compare) and device kind. The slow stage is where to look when "
        "queue wait grows.",
        quantiles("attnaudit_job_stage_duration_seconds",
                  "stage, device_kind", SEL, "{{stage}} ({{device_kind}})"),
        "s", w=6)
    timeseries(
        "Device run time per job",
        "p50 and p99 of the whole device run of a job, by device kind.",
        quantiles("attnaudit_job_duration_seconds", "device_kind", SEL,
                  "{{device_kind}}"),
        "s", w=6)
    timeseries(
        "Jobs finished/s by outcome",
        "Admitted jobs by how they ended. failed = internal error "
        "(AttnauditJobsFailing at 5%); deadline_exceeded / cancelled = the "
        "client's deadline or cancel; unavailable = shut down mid-job "
        "(Submits resume from the spool).",
        [("sum by (outcome) (rate(attnaudit_jobs_completed_total{%s}[%s]))"
          % (SEL, RATE), "{{outcome}}")],
        "ops", w=6, stack=True,
        overrides=[color_override("ok", "green"),
                   color_override("failed", "red")])


def _devices_and_build():
    """The Devices, memory and build row, up to the build info table."""
    # ----------------------------------------------------- Devices/build ----
    row("Devices, memory and build")
    timeseries(
        "Devices by kind and state",
        "Device pool by kind and state (stacked). All busy for long = add "
        "replicas or devices.",
        [("sum by (kind, state) (attnaudit_devices{%s})" % SEL,
          "{{kind}} {{state}}")],
        "short", w=6, stack=True,
        overrides=[color_override("cpu busy", "orange")])
    timeseries(
        "Queued bytes (memory budget use)",
        "Snapshot bytes held by queued jobs per replica; at "
        "--memory-budget-bytes new work is refused with memory_budget.",
        [("sum by (instance) (attnaudit_queued_bytes{%s})" % SEL,
          "{{instance}}")],
        "bytes", w=6)
    timeseries(
        "Received bytes/s",
        "Snapshot bytes received over RPC per replica.",
        [("sum by (instance) (rate(attnaudit_received_bytes_total{%s}[%s]))"
          % (SEL, RATE), "{{instance}}")],
        "Bps", w=6)
    PANELS.append({
        "type": "table", "title": "Build info",
        "description": "Version of every selected replica "
                       "(attnaudit_build_info). Mixed versions = a rollout "
                       "in progress or stuck.",
        "id": L.id(), "gridPos": L.place(6, 8), "datasource": DS,
        "targets": [dict(target("attnaudit_build_info{%s}" % SEL,
                                instant=True), format="table")],
        "fieldConfig": {"defaults": {"unit": "none"}, "overrides": []},
        "options": {"showHeader": True},
        "transformations": [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True, "__name__": True},
            "indexByName": {"instance": 0, "version": 1, "job": 2}}}],
    })


def _store_and_fleet():
    """The store and fleet panels closing that row."""
    L.newline()
    timeseries(
        "Job store up",
        "1 while a replica's job store (SQLite under --data-dir, or the "
        "fleet's PostgreSQL) answers its result feed's reads (every 200 ms), "
        "0 while it does not: Submits and result reads then fail UNAVAILABLE "
        "and nothing reaches the watchers. 0 for 2 minutes fires "
        "AttnauditStoreDown; every replica at 0 = the shared PostgreSQL is "
        "down.",
        [("min by (instance) (attnaudit_store_up{%s})" % SEL, "{{instance}}")],
        "short", w=12)
    timeseries(
        "Fleet jobs taken over",
        "Unfinished jobs of a replica that died or drained, claimed and run "
        "by another (per claiming replica). Bursts follow replica restarts "
        "and scale-downs; a steady rate means replicas keep losing their "
        "heartbeat (database latency, --fleet-lease too short).",
        [("sum by (instance) (increase(attnaudit_fleet_jobs_taken_over_total"
          "{%s}[%s]))" % (SEL, RATE), "{{instance}}")],
        "short", w=12)


# The panels of attnaudit.json, in their order on the dashboard.
PANEL_STAGES = (_overview_verdicts, _overview_traffic, _overview_timeseries,
                _drift_quantiles, _drift_fractions, _drift_rankings, _check_drifts,
                _pairs, _latency, _devices_and_build, _store_and_fleet)


def build_panels():
    """Appends every panel of attnaudit.json to PANELS, row by row."""
    for stage in PANEL_STAGES:
        stage()


def query_var(name, label, query, multi=True, include_all=True, sort=1,
              current=None, all_value=".*"):
    """all_value None: Grafana's "All" is the regex of the values found."""
    v = {"name": name, "label": label, "type": "query", "datasource": DS,
         "definition": query, "query": query, "refresh": 2, "regex": "",
         "sort": sort, "multi": multi, "includeAll": include_all,
         "allValue": all_value, "hide": 0,
         "current": current or {"selected": True, "text": ["All"],
                                "value": ["$__all"]},
         "options": []}
    return v


def templating():
    return {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "regex": "", "hide": 0, "refresh": 1,
         "includeAll": False, "multi": False,
         "current": {"selected": True, "text": "Prometheus",
                     "value": DATASOURCE_UID},
         "options": []},
        # All = the jobs found exporting attnaudit_build_info, not ".*".
        query_var("job", "Job", "label_values(attnaudit_build_info, job)",
                  all_value=None),
        query_var("instance", "Instance",
                  'label_values(attnaudit_build_info{job=~"$job"}, instance)'),
        {"name": "comparison", "label": "Comparison", "type": "custom",
         "query": "engine_vs_reference,replay_vs_reference,engine_vs_replay",
         "multi": True, "includeAll": True, "allValue": ".*", "hide": 0,
         "current": {"selected": True, "text": ["engine_vs_reference"],
                     "value": ["engine_vs_reference"]},
         "options": []},
        query_var("model", "Model",
                  'label_values(attnaudit_drift_out_max_abs_count'
                  '{job=~"$job"}, model)'),
        query_var("layer", "Layer",
                  'label_values(attnaudit_drift_out_max_abs_count'
                  '{job=~"$job",model=~"$model"}, layer)', sort=3),
    ]}


def reset_layout():
    global L, PANELS
    L = Layout()
    PANELS = []


def dashboard():
    reset_layout()
    build_panels()
    return {
        "uid": "attnaudit-overview",
        "title": "attnaudit",
        "description": "attnaudit-server: verdicts, drift by model/layer, "
                       "admission and queueing, latency, devices. Alerts: "
                       "deploy/prometheus/alerts.yml; runbook: "
                       "docs/DEPLOYMENT.md.",
        "tags": ["attnaudit"],
        "editable": False,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": templating(),
        "panels": PANELS,
    }


# ------------------------------------------------------------ store ----
# attnaudit-store.json: SQL over the PostgreSQL store of a fleet
# (server/store/postgres_job_store.cc, table attnaudit_jobs). The columns
# used: state, verdict (1 PASS, 2 DRIFT, 3 INVALID; DONE rows only), model,
# layer (-1: not labelled), engine, backend, step (-1: not labelled), run,
# diagnosis (the top hypothesis of a DRIFT, "" when none), replica, tenant,
# job_id, finished_us (microseconds since the epoch).

# Terminal rows with their finish time as a timestamp. A column, not an
# expression, goes into $__timeFilter(): Grafana's macro regex ends the
# argument at the first ")". (The filter on to_timestamp() cannot use the
# index on finished_us; at the default --retention-count of 100000 rows a
# scan takes milliseconds.)
STORE_JOBS = ("(SELECT *, to_timestamp(finished_us / 1e6) AS finished\n"
              "      FROM attnaudit_jobs\n"
              "      WHERE state IN ('DONE', 'FAILED', 'CANCELLED')) AS j")
# The `tenant` and `model` variables' "All" is this literal (Grafana inserts
# a custom allValue unquoted), so All also matches values that appeared
# after the variable's options were loaded; a selection is a quoted list.
STORE_ALL = "'__all__'"


def store_var_match(column, var):
    return "(%s IN ($%s) OR %s IN ($%s))" % (STORE_ALL, var, column, var)


STORE_WHERE = ("$__timeFilter(finished)\n  AND %s\n  AND %s"
               % (store_var_match("tenant", "tenant"),
                  store_var_match("model", "model")))
STORE_DRIFT = "state = 'DONE' AND verdict = 2"
LATEST_DRIFT_LIMIT = 100
LAYER_LABEL = "CASE WHEN layer < 0 THEN 'no layer' ELSE 'layer ' || layer END"


def sql_target(sql, fmt="table"):
    return {"datasource": STORE_DS, "refId": "A", "editorMode": "code",
            "format": fmt, "rawQuery": True, "rawSql": sql}


def sql_panel(kind, title, description, sql, w, h, fmt="table", unit="none",
              options=None, field_config=None, **extra):
    defaults = {"unit": unit}
    defaults.update(field_config or {})
    p = {"type": kind, "title": title, "description": description,
         "id": L.id(), "gridPos": L.place(w, h), "datasource": STORE_DS,
         "targets": [sql_target(sql, fmt)],
         "fieldConfig": {"defaults": defaults, "overrides": []},
         "options": options or {}}
    p.update(extra)
    PANELS.append(p)


def _store_latest_drift():
    """The newest DRIFT audits, a full-width table."""
    sql_panel(
        "table", "Latest DRIFT audits",
        "The newest audits whose verdict is DRIFT (at most %d), from every "
        "replica of the fleet: when the result was committed, the snapshot's "
        "labels (layer and step -1: not labelled), the top diagnosis "
        "hypothesis (empty: none; 'unexplained': no known bug fits) and the "
        "replica that ran it. `attnaudit get JOB --json` on any replica "
        "shows the whole report." % LATEST_DRIFT_LIMIT,
        "SELECT finished, model, layer,\n"
        "       concat_ws('/', NULLIF(engine, ''), NULLIF(backend, ''))"
        " AS \"engine/backend\",\n"
        "       step, run, diagnosis, replica, tenant, job_id\n"
        "FROM %s\n"
        "WHERE %s\n  AND %s\n"
        "ORDER BY finished_us DESC, job_id DESC\n"
        "LIMIT %d" % (STORE_JOBS, STORE_DRIFT, STORE_WHERE,
                      LATEST_DRIFT_LIMIT),
        w=24, h=10,
        options={"showHeader": True, "cellHeight": "sm",
                 "footer": {"show": False, "reducer": ["sum"],
                            "countRows": False, "fields": ""}},
        field_config={"custom": {"align": "auto", "filterable": True}},
    )
    L.newline()


def _store_drift_over_time():
    """DRIFT per layer over time."""
    sql_panel(
        "timeseries", "DRIFT by layer over time",
        "DRIFT verdicts per layer, counted per time bucket ($__interval, "
        "by finish time), all selected tenants and models. One layer "
        "rising alone points at that layer's kernel path or its KV pages; "
        "all layers at once at something shared (RoPE, the cache, a merge).",
        "SELECT $__timeGroupAlias(finished, $__interval),\n"
        "       %s AS metric,\n"
        "       count(*) AS drift\n"
        "FROM %s\n"
        "WHERE %s\n  AND %s\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2" % (LAYER_LABEL, STORE_JOBS, STORE_DRIFT, STORE_WHERE),
        w=12, h=9, fmt="time_series", unit="short",
        field_config={"min": 0, "decimals": 0,
                      "color": {"mode": "palette-classic"},
                      "custom": {"drawStyle": "bars", "fillOpacity": 60,
                                 "lineWidth": 1, "showPoints": "never",
                                 "stacking": {"mode": "normal",
                                              "group": "A"}}},
        options={"legend": {"displayMode": "table", "placement": "right",
                            "calcs": ["sum"], "showLegend": True},
                 "tooltip": {"mode": "multi", "sort": "desc"}},
    )


def _store_drift_over_steps():
    """DRIFT per layer over training steps."""
    sql_panel(
        "table", "DRIFT by layer over steps",
        "DRIFT verdicts per training step (rows, newest first) and layer "
        "(columns) over the time range: a matrix of where in the run and "
        "where in the model the engine drifted. Runs and models of the "
        "selection are added together; pick one model to read one run's "
        "layers. Step -1: snapshots without a step label.",
        "SELECT step, %s AS layer, count(*) AS drift\n"
        "FROM %s\n"
        "WHERE %s\n  AND %s\n"
        "GROUP BY step, j.layer\n"
        "ORDER BY step DESC, j.layer" % (LAYER_LABEL, STORE_JOBS,
                                         STORE_DRIFT, STORE_WHERE),
        w=12, h=9,
        options={"showHeader": True, "cellHeight": "sm"},
        field_config={"custom": {"align": "center",
                                 "cellOptions": {"type": "color-background",
                                                 "mode": "basic"}},
                      "color": {"mode": "thresholds"},
                      "thresholds": thresholds((1, "orange"), (5, "red"))},
        transformations=[{"id": "groupingToMatrix", "options": {
            "rowField": "step", "columnField": "layer",
            "valueField": "drift"}}],
    )
    L.newline()


def _store_verdicts_per_replica():
    """Finished jobs per replica by verdict and state."""
    sql_panel(
        "barchart", "Verdicts per replica",
        "Finished jobs per replica over the time range: PASS, DRIFT and "
        "INVALID verdicts, FAILED (internal error) and CANCELLED jobs. A "
        "replica with far more FAILED than its peers has a local problem "
        "(device, disk); DRIFT spread over every replica is about the "
        "engines, not the service.",
        "SELECT CASE WHEN replica = '' THEN '(unknown)' ELSE replica END"
        " AS replica,\n"
        "       count(*) FILTER (WHERE state = 'DONE' AND verdict = 1)"
        " AS \"PASS\",\n"
        "       count(*) FILTER (WHERE state = 'DONE' AND verdict = 2)"
        " AS \"DRIFT\",\n"
        "       count(*) FILTER (WHERE state = 'DONE' AND verdict = 3)"
        " AS \"INVALID\",\n"
        "       count(*) FILTER (WHERE state = 'FAILED') AS \"FAILED\",\n"
        "       count(*) FILTER (WHERE state = 'CANCELLED')"
        " AS \"CANCELLED\"\n"
        "FROM %s\n"
        "WHERE %s\n"
        "GROUP BY 1\n"
        "ORDER BY 1" % (STORE_JOBS, STORE_WHERE),
        w=12, h=9, unit="short",
        options={"orientation": "horizontal", "stacking": "normal",
                 "xField": "replica", "showValue": "auto",
                 "barWidth": 0.8, "groupWidth": 0.7,
                 "legend": {"displayMode": "list", "placement": "bottom",
                            "showLegend": True},
                 "tooltip": {"mode": "multi", "sort": "none"}},
        field_config={"min": 0, "color": {"mode": "palette-classic"},
                      "custom": {"fillOpacity": 80, "lineWidth": 1}},
    )
    PANELS[-1]["fieldConfig"]["overrides"] = [
        color_override("PASS", "green"), color_override("DRIFT", "orange"),
        color_override("INVALID", "red"), color_override("FAILED", "purple"),
        color_override("CANCELLED", "text")]


def _store_diagnoses():
    """DRIFT of the last 24 hours by top diagnosis."""
    sql_panel(
        "bargauge", "Diagnoses (last 24h)",
        "DRIFT verdicts of the last 24 hours (whatever the dashboard's "
        "range) by their top diagnosis hypothesis: the known engine bug "
        "that explains the drift (stale-page, rope-offset, lse-base2, ...), "
        "'unexplained' when none does, '(none)' when the audit made no "
        "diagnosis. One class dominating names the bug to look for.",
        "SELECT CASE WHEN diagnosis = '' THEN '(none)' ELSE diagnosis END"
        " AS diagnosis,\n"
        "       count(*) AS drift\n"
        "FROM %s\n"
        "WHERE %s\n  AND %s\n"
        "GROUP BY 1\n"
        "ORDER BY 2 DESC, 1" % (STORE_JOBS, STORE_DRIFT, STORE_WHERE),
        w=12, h=9, unit="short",
        options={"orientation": "horizontal", "displayMode": "basic",
                 "showUnfilled": True, "valueMode": "color",
                 "reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                   "values": True}},
        field_config={"min": 0, "decimals": 0,
                      "color": {"mode": "fixed", "fixedColor": "orange"},
                      "thresholds": thresholds()},
        timeFrom="24h",
    )


# The panels of attnaudit-store.json, in their order on the dashboard.
STORE_PANEL_STAGES = (_store_latest_drift, _store_drift_over_time,
                      _store_drift_over_steps, _store_verdicts_per_replica,
                      _store_diagnoses)


def build_store_panels():
    """Appends every panel of attnaudit-store.json to PANELS."""
    for stage in STORE_PANEL_STAGES:
        stage()


def store_query_var(name, label, sql):
    return {"name": name, "label": label, "type": "query",
            "datasource": STORE_DS, "definition": sql, "query": sql,
            "refresh": 1, "regex": "", "sort": 1, "multi": True,
            "includeAll": True, "allValue": STORE_ALL, "hide": 0,
            "current": {"selected": True, "text": ["All"],
                        "value": ["$__all"]},
            "options": []}


def store_templating():
    terminal = "state IN ('DONE', 'FAILED', 'CANCELLED')"
    return {"list": [
        {"name": "datasource", "label": "Store", "type": "datasource",
         "query": STORE_DS_TYPE, "regex": "", "hide": 0, "refresh": 1,
         "includeAll": False, "multi": False,
         "current": {"selected": True, "text": "attnaudit store",
                     "value": STORE_DS_UID},
         "options": []},
        store_query_var(
            "tenant", "Tenant",
            "SELECT DISTINCT tenant FROM attnaudit_jobs WHERE %s ORDER BY 1"
            % terminal),
        store_query_var(
            "model", "Model",
            "SELECT DISTINCT model FROM attnaudit_jobs WHERE %s "
            "AND model <> '' AND %s ORDER BY 1"
            % (terminal, store_var_match("tenant", "tenant"))),
    ]}


def store_dashboard():
    reset_layout()
    build_store_panels()
    return {
        "uid": "attnaudit-store",
        "title": "attnaudit store",
        "description": "The audits a fleet of attnaudit-server replicas "
                       "stored in PostgreSQL (--store postgresql://...): "
                       "latest DRIFT verdicts with their labels and "
                       "diagnosis, DRIFT by layer, verdicts per replica. "
                       "docs/DEPLOYMENT.md, 'A fleet on PostgreSQL'.",
        "tags": ["attnaudit"],
        "editable": False,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": "1m",
        "schemaVersion": 39,
        "version": 1,
        # The default --retention-age: everything the store still holds.
        "time": {"from": "now-7d", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [{"title": "attnaudit", "type": "link", "icon": "dashboard",
                   "url": "/d/attnaudit-overview", "keepTime": True,
                   "includeVars": False, "asDropdown": False,
                   "targetBlank": False, "tags": [], "tooltip": ""}],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana",
                                         "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": store_templating(),
        "panels": PANELS,
    }


def render():
    """{path: JSON text} of every dashboard."""
    out = {}
    for path, build in ((OUT, dashboard), (OUT_STORE, store_dashboard)):
        out[path] = json.dumps(build(), indent=2, sort_keys=False) + "\n"
    return out


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="dashboard_gen.py",
        description="Generate the Grafana dashboards of deploy/grafana/"
                    "dashboards/ (attnaudit.json, attnaudit-store.json). "
                    "Without options, rewrite both files.")
    parser.add_argument(
        "--check", action="store_true",
        help="write nothing; exit 1 (naming the file) when a committed JSON "
             "differs from what this script generates, 0 when both match")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    texts = render()
    if args.check:
        stale = 0
        for path, text in texts.items():
            try:
                with open(path, encoding="utf-8") as f:
                    current = f.read()
            except OSError as e:
                print("dashboard_gen: cannot read %s: %s" % (path, e))
                stale += 1
                continue
            if current != text:
                print("dashboard_gen: %s is stale; run "
                      "python3 deploy/grafana/dashboard_gen.py" % path)
                stale += 1
        return 1 if stale else 0
    for path, text in texts.items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote %s (%d panels)" % (path,
                                        len(json.loads(text)["panels"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
