#!/usr/bin/env python3
"""Offline checks of deploy/ that need no Prometheus server (stdlib only;
PyYAML optional). Called by check_deploy.sh, one subcommand per check:

  families                      print the metric families parsed from
                                server/metrics/metrics.h
  dashboard                     lint deploy/grafana/dashboards/attnaudit.json:
                                datasource/variables conventions, and every
                                PromQL expression names only families (and
                                labels) of metrics.h
  alerts                        the same name/label check for
                                deploy/prometheus/alerts.yml
  store-dashboard               lint deploy/grafana/dashboards/
                                attnaudit-store.json against its provisioned
                                PostgreSQL datasource (uid, plugin type,
                                ${datasource} everywhere, raw SQL targets);
                                its SQL runs in store_panels_test.py
                                (PyYAML; 77 without it)
  emit-rules OUT                write the dashboard's expressions (Grafana
                                variables substituted) as recording rules, for
                                `promtool check rules` to parse them
  yaml FILE...                  every YAML document parses (exit 77 when
                                PyYAML is not installed: a failure)
  consistency                   the server flags used by the Dockerfile,
                                compose, the StatefulSet and the fleet
                                overlay's Deployment exist in
                                server/main/server_flags.cc; shutdown budgets
                                (grace > preStop + drain delay + drain
                                timeout + gRPC/metrics teardown); probes,
                                ports, selectors and names agree; the
                                fleet overlay takes --store from its Secret
                                and --replica-id from the pod name, spools
                                on an emptyDir, and reaches its example
                                PostgreSQL (PyYAML; 77 without it)

Exit status: 0 ok, 1 problems found (printed one per line), 77 a module
is missing (PyYAML; Debian: python3-yaml).
The PromQL scan is a tokenizer, not a parser: it strips strings, label
matchers, ranges and numbers, then treats an identifier followed by "(" as a
function/aggregation and any other non-keyword identifier as a metric name.
promtool (emit-rules) checks the real syntax.
"""
import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
METRICS_H = os.path.join(ROOT, "server", "metrics", "metrics.h")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "dashboards",
                         "attnaudit.json")
STORE_DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "dashboards",
                               "attnaudit-store.json")
STORE_DATASOURCE = os.path.join(ROOT, "deploy", "grafana", "provisioning",
                                "datasources", "attnaudit-store.yml")
ALERTS = os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")
SERVER_FLAGS_CC = os.path.join(ROOT, "server", "main", "server_flags.cc")
DEPLOY = os.path.join(ROOT, "deploy")
HEALTH_SERVICE = "attnaudit.v1.AuditService"
# After the drain timeout the server gives gRPC calls 5 s and the metrics
# endpoint ~2 s to close (server/app/audit_server.cc, server/metrics/metrics.h).
TEARDOWN_S = 7

# Series Prometheus itself attaches to every target; allowed besides metrics.h.
SYNTHETIC = {"up": {"job", "instance"}}
TARGET_LABELS = {"job", "instance"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right",
            "bool", "and", "or", "unless", "offset", "inf", "nan", "atan2"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count"), "counter": (), "gauge": ()}
# Grafana's interval variables and the values used when checking syntax.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m",
                     "$__range": "1h", "${__rate_interval}": "5m",
                     "${__interval}": "1m", "${__range}": "1h"}


def parse_families(path=METRICS_H):
    """{name: (type, set(labels))} from the header's comment block, lines like
    //   attnaudit_queue_depth{class}                       gauge"""
    fams = {}
    line_re = re.compile(
        r"^//\s+(attnaudit_[a-z0-9_]+)(\{([a-z_,\s]*)\})?\s+"
        r"(gauge|counter|histogram|summary)\b")
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = line_re.match(line.strip())
            if m:
                labels = {l.strip() for l in (m.group(3) or "").split(",")
                          if l.strip()}
                fams[m.group(1)] = (m.group(4), labels)
    return fams


def resolve(name, fams):
    """(family labels incl. target labels, is_bucket) or None."""
    if name in SYNTHETIC:
        return SYNTHETIC[name], False
    for fam, (typ, labels) in fams.items():
        if name == fam and typ != "histogram":
            return labels | TARGET_LABELS, False
        for suf in SUFFIXES[typ]:
            if name == fam + suf:
                extra = {"le"} if suf == "_bucket" else set()
                return labels | TARGET_LABELS | extra, suf == "_bucket"
    return None


def substitute(expr):
    for k, v in GRAFANA_INTERVALS.items():
        expr = expr.replace(k, v)
    # Template variables ($model, ${layer}) only ever appear inside =~ / !~
    # matchers (checked separately), where ".*" keeps the regex valid.
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def check_expr(expr, fams, where):
    """Returns a list of problems of one PromQL expression."""
    problems = []
    # Variables must sit in regex matchers: `model="$model"` breaks on All.
    for m in re.finditer(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"', expr):
        if "$" in substitute_intervals_only(m.group(3)) and \
                m.group(2) not in ("=~", "!~"):
            problems.append("%s: variable in non-regex matcher %s"
                            % (where, m.group(0)))
    e = substitute(expr)
    names = []  # (metric name, matcher labels)
    # Selectors with braces: record matcher labels, then blank the braces.
    sel_re = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")

    def take(m):
        labels = {x.group(1) for x in re.finditer(
            r'([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*"', m.group(2))}
        if m.group(1) and m.group(1) not in KEYWORDS:
            names.append((m.group(1), labels))
            return " __SEL__ "
        if m.group(1) is None or m.group(1) in KEYWORDS:
            problems.append("%s: selector without a metric name: %s"
                            % (where, m.group(0)))
        return " __SEL__ "

    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)  # string args (label_replace)
    e = sel_re.sub(take, e)
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    e = re.sub(r"\boffset\s+-?\w+", " ", e)
    grouping = set()
    for m in re.finditer(r"\b(%s)\s*\(([^)]*)\)" % "|".join(GROUPING), e):
        grouping |= {x.strip() for x in m.group(2).split(",") if x.strip()}
    e = re.sub(r"\b(%s)\s*\([^)]*\)" % "|".join(GROUPING), " ", e)
    e = re.sub(r"(?<![\w.])\d+(?:\.\d*)?(?:[eE][+-]?\d+)?", " ", e)
    for m in re.finditer(r"[A-Za-z_:][\w:]*", e):
        tok = m.group(0)
        rest = e[m.end():].lstrip()
        if tok == "__SEL__" or tok.lower() in KEYWORDS or rest.startswith("("):
            continue
        names.append((tok, set()))
    if not names:
        problems.append("%s: no metric referenced in %r" % (where, expr))
    known = set(TARGET_LABELS) | {"le"}
    for name, labels in names:
        r = resolve(name, fams)
        if r is None:
            problems.append("%s: unknown metric %r (not in metrics.h)"
                            % (where, name))
            continue
        allowed, _ = r
        known |= allowed
        for l in sorted(labels - allowed):
            problems.append("%s: metric %s has no label %r" % (where, name, l))
    for l in sorted(grouping - known):
        problems.append("%s: grouping label %r is on none of the metrics"
                        % (where, l))
    return problems


def substitute_intervals_only(s):
    for k in GRAFANA_INTERVALS:
        s = s.replace(k, "")
    return s


def dashboard_exprs(d):
    """[(where, expr)] of every panel target and query variable."""
    out = []

    def walk(panels):
        for p in panels:
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            for t in p.get("targets", []):
                out.append(("panel %r target %s" % (p.get("title"),
                                                     t.get("refId")),
                            t.get("expr", "")))
    walk(d.get("panels", []))
    return out


def label_values_queries(d):
    out = []
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*",
                         q or "")
        out.append((v.get("name"), q, m))
    return out


def cmd_dashboard(fams):
    problems = []
    with open(DASHBOARD, encoding="utf-8") as f:
        d = json.load(f)
    if "__inputs" in d:
        problems.append("dashboard has __inputs (not resolvable by file "
                        "provisioning)")
    if not d.get("uid"):
        problems.append("dashboard has no fixed uid")
    text = json.dumps(d)
    if "${DS_" in text:
        problems.append("dashboard references a ${DS_...} import input")
    variables = {v.get("name"): v for v in d.get("templating", {})
                 .get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != \
            "prometheus":
        problems.append("no `datasource` variable of type datasource/"
                        "prometheus")
    for need in ("model", "layer"):
        if need not in variables:
            problems.append("no %r template variable" % need)
    for v in variables.values():
        if v.get("type") == "query" and \
                v.get("datasource", {}).get("uid") != "${datasource}":
            problems.append("variable %s does not use ${datasource}"
                            % v.get("name"))
    ids = set()

    def walk(panels):
        for p in panels:
            if p.get("id") in ids:
                problems.append("duplicate panel id %s" % p.get("id"))
            ids.add(p.get("id"))
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            title = p.get("title")
            if p.get("datasource", {}).get("uid") != "${datasource}":
                problems.append("panel %r: datasource is not ${datasource}"
                                % title)
            if not p.get("description"):
                problems.append("panel %r: no description" % title)
            if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                problems.append("panel %r: no unit" % title)
            if not p.get("targets"):
                problems.append("panel %r: no query" % title)
            for t in p.get("targets", []):
                if t.get("datasource", {}).get("uid") != "${datasource}":
                    problems.append("panel %r target %s: datasource is not "
                                    "${datasource}" % (title, t.get("refId")))
    walk(d.get("panels", []))
    exprs = dashboard_exprs(d)
    for where, expr in exprs:
        problems += check_expr(expr, fams, where)
        if "rate(" in expr and "[" in expr and \
                not re.search(r"\[(\$__rate_interval|\$__range|10m)\]", expr):
            problems.append("%s: rate window is neither $__rate_interval, "
                            "$__range nor 10m" % where)
    for name, q, m in label_values_queries(d):
        if m is None:
            problems.append("variable %s: not a label_values() query: %r"
                            % (name, q))
            continue
        where = "variable %s" % name
        problems += check_expr(m.group(1), fams, where)
        r = resolve(re.match(r"\s*([A-Za-z_:][\w:]*)", m.group(1)).group(1),
                    fams)
        if r and m.group(2) not in r[0]:
            problems.append("%s: label %r is not on %s" % (where, m.group(2),
                                                           m.group(1)))
    for p in problems:
        print("dashboard: " + p)
    if not problems:
        print("dashboard: %d expressions, %d variables reference only "
              "metrics.h families" % (len(exprs), len(variables)))
    return 1 if problems else 0


def cmd_store_dashboard():
    try:
        import yaml
    except ImportError:
        print("store-dashboard: PyYAML not installed (Debian: python3-yaml)")
        return 77
    problems = []
    with open(STORE_DATASOURCE, encoding="utf-8") as f:
        sources = yaml.safe_load(f).get("datasources", [])
    if len(sources) != 1:
        problems.append("%s: expected one datasource"
                        % os.path.relpath(STORE_DATASOURCE, ROOT))
    src = sources[0] if sources else {}
    if src.get("uid") != "attnaudit-store":
        problems.append("datasource uid is %r, want attnaudit-store"
                        % src.get("uid"))
    if src.get("type") not in ("grafana-postgresql-datasource", "postgres"):
        problems.append("datasource type %r is not Grafana's PostgreSQL"
                        % src.get("type"))
    # Connection settings come from the environment, never the file.
    for key, value in (("url", src.get("url")), ("user", src.get("user")),
                       ("database", src.get("jsonData", {}).get("database")),
                       ("password", src.get("secureJsonData", {})
                        .get("password"))):
        if not re.fullmatch(r"\$\{?[A-Z][A-Z0-9_]*\}?", str(value or "")):
            problems.append("datasource %s is %r, not an environment "
                            "variable" % (key, value))
    if "password" in src:
        problems.append("datasource: password outside secureJsonData")
    with open(STORE_DASHBOARD, encoding="utf-8") as f:
        d = json.load(f)
    if d.get("uid") != "attnaudit-store":
        problems.append("store dashboard uid is %r" % d.get("uid"))
    text = json.dumps(d)
    if "__inputs" in d or "${DS_" in text:
        problems.append("store dashboard uses import inputs")
    variables = {v.get("name"): v for v in d.get("templating", {})
                 .get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != src.get("type"):
        problems.append("no `datasource` variable of type datasource/%s"
                        % src.get("type"))
    if ds.get("current", {}).get("value") != src.get("uid"):
        problems.append("`datasource` variable does not default to %s"
                        % src.get("uid"))
    for need in ("tenant", "model"):
        v = variables.get(need)
        if not v or v.get("type") != "query" or \
                v.get("datasource", {}).get("uid") != "${datasource}":
            problems.append("no %r query variable on ${datasource}" % need)
    ids = set()
    for p in d.get("panels", []):
        title = p.get("title")
        if p.get("id") in ids:
            problems.append("duplicate panel id %s" % p.get("id"))
        ids.add(p.get("id"))
        for obj, what in [(p, "panel %r" % title)] + [
                (t, "panel %r target %s" % (title, t.get("refId")))
                for t in p.get("targets", [])]:
            pds = obj.get("datasource", {})
            if pds.get("uid") != "${datasource}" or \
                    pds.get("type") != src.get("type"):
                problems.append("%s: datasource is not ${datasource} (%s)"
                                % (what, src.get("type")))
        if not p.get("description"):
            problems.append("panel %r: no description" % title)
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append("panel %r: no unit" % title)
        if not p.get("targets"):
            problems.append("panel %r: no query" % title)
        for t in p.get("targets", []):
            if not t.get("rawQuery") or not t.get("rawSql"):
                problems.append("panel %r: target is not raw SQL" % title)
            if t.get("format") not in ("table", "time_series"):
                problems.append("panel %r: format %r" % (title,
                                                        t.get("format")))
    for p in problems:
        print("store-dashboard: " + p)
    if not problems:
        print("store-dashboard: %d panels on datasource %s (%s)"
              % (len(d.get("panels", [])), src.get("uid"), src.get("type")))
    return 1 if problems else 0


def rule_exprs(path):
    """[(alert, expr)] from a rules file; a tiny reader for our own layout
    (`- alert: X` / `expr: |` block or one-line expr), so PyYAML is not
    required."""
    out = []
    alert = None
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"\s*- (?:alert|record):\s*(\S+)", line)
        if m:
            alert = m.group(1)
        m = re.match(r"(\s*)expr:\s*(.*)$", line)
        if m:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest in ("|", ">", "|-", ">-"):
                body = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip())
                                          > indent):
                    body.append(lines[i].strip())
                    i += 1
                out.append((alert, " ".join(body)))
                continue
            out.append((alert, rest))
        i += 1
    return out


def cmd_alerts(fams):
    problems = []
    exprs = rule_exprs(ALERTS)
    if not exprs:
        problems.append("no expressions found in %s" % ALERTS)
    for alert, expr in exprs:
        problems += check_expr(expr, fams, "alert %s" % alert)
    for p in problems:
        print("alerts: " + p)
    if not problems:
        print("alerts: %d expressions reference only metrics.h families"
              % len(exprs))
    return 1 if problems else 0


def cmd_emit_rules(out_path):
    with open(DASHBOARD, encoding="utf-8") as f:
        d = json.load(f)
    exprs = dashboard_exprs(d)
    for name, q, m in label_values_queries(d):
        if m:
            exprs.append(("variable " + name, m.group(1)))
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("# generated from %s\ngroups:\n  - name: dashboard\n"
                "    rules:\n" % DASHBOARD)
        for i, (where, expr) in enumerate(exprs):
            f.write("      # %s\n" % where.replace("\n", " "))
            f.write("      - record: dashboard:expr_%d\n" % i)
            f.write("        expr: %s\n" % json.dumps(substitute(expr)))
    print("emit-rules: %d expressions -> %s" % (len(exprs), out_path))
    return 0


def cmd_yaml(files):
    try:
        import yaml  # noqa: F401  (Debian: python3-yaml)
    except ImportError:
        print("yaml: PyYAML not installed (Debian: python3-yaml)")
        return 77
    bad = 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                docs = [x for x in yaml.safe_load_all(f) if x is not None]
            if not docs:
                raise ValueError("no YAML document")
            print("yaml: ok %s (%d document%s)" % (
                os.path.relpath(path, ROOT), len(docs),
                "" if len(docs) == 1 else "s"))
        except Exception as e:  # report every file, then fail
            print("yaml: FAIL %s: %s" % (os.path.relpath(path, ROOT), e))
            bad += 1
    return 1 if bad else 0


def server_flag_names():
    """The server's flags, spelled with dashes as documented (one
    ATTNAUDIT_SERVER_FLAG row each, named with underscores; the server reads
    a dash as an underscore)."""
    text = open(SERVER_FLAGS_CC, encoding="utf-8").read()
    return {name.replace("_", "-") for name in re.findall(
        r'^ATTNAUDIT_SERVER_FLAG\(\s*[\w:<>]+\s*,\s*([a-z0-9_]+)\s*,', text,
        re.M)}


def flag_args(args):
    """{name: value} of ["--a=1", "--b", "2", ...]."""
    out, i = {}, 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            else:
                k = a[2:]
                v = str(args[i + 1]) if i + 1 < len(args) and \
                    not str(args[i + 1]).startswith("--") else ""
                i += 1 if v else 0
            out[k] = v
        i += 1
    return out


def seconds(v):
    """'30s', '1m30s', '2m', '45s', 60 -> seconds (float)."""
    if isinstance(v, (int, float)):
        return float(v)
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|h|m|s|d)", str(v)):
        if m.start() != pos:
            raise ValueError("bad duration %r" % v)
        pos = m.end()
        total += float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600,
                                      "d": 86400}[m.group(2)]
    if pos != len(str(v)) or pos == 0:
        raise ValueError("bad duration %r" % v)
    return total


def server_pod_problems(kind, pod, entry, known):
    """Problems of an attnaudit-server pod spec (its first container):
    flags, shutdown budget, ports, probes, data dir. Returns (problems,
    {port name: number}, the merged {flag: value} of entrypoint + args)."""
    problems = []
    c = (pod.get("containers") or [{}])[0]
    kflags = flag_args(c.get("args", []))
    for k in kflags:
        if k.replace("_", "-") not in known:
            problems.append("%s args: --%s is not a server flag" % (kind, k))
    merged = dict(entry, **kflags)
    pre = c.get("lifecycle", {}).get("preStop", {})
    sleep_s = 0.0
    if "exec" in pre:
        cmd = pre["exec"].get("command", [])
        if len(cmd) == 2 and cmd[0] == "sleep":
            sleep_s = seconds(cmd[1] if not str(cmd[1]).isdigit()
                              else int(cmd[1]))
    elif "sleep" in pre:
        sleep_s = float(pre["sleep"].get("seconds", 0))
    if sleep_s <= 0:
        problems.append("%s: no preStop sleep" % kind)
    budget = sleep_s + seconds(merged.get("drain-delay", "0s")) + \
        seconds(merged.get("drain-timeout", "30s")) + TEARDOWN_S
    grace = float(pod.get("terminationGracePeriodSeconds", 30))
    if grace <= budget:
        problems.append("%s: terminationGracePeriodSeconds %g <= "
                        "preStop + drain delay + drain timeout + teardown %g"
                        % (kind, grace, budget))
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    if ports.get("grpc") != 50051 or ports.get("metrics") != 9464:
        problems.append("%s: ports grpc/metrics are not 50051/9464" % kind)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = c.get(probe, {}).get("grpc")
        if not g or g.get("port") != ports.get("grpc"):
            problems.append("%s: %s is not a gRPC probe on the "
                            "numeric gRPC port" % (kind, probe))
    if c.get("readinessProbe", {}).get("grpc", {}).get("service") != \
            HEALTH_SERVICE:
        problems.append("%s: readiness must probe service %s"
                        % (kind, HEALTH_SERVICE))
    mounts = {m.get("mountPath") for m in c.get("volumeMounts", [])}
    if merged.get("data-dir", "./var/attnaudit") not in mounts:
        problems.append("%s: data dir %s is not a mounted volume"
                        % (kind, merged.get("data-dir")))
    return problems, ports, merged


def entrypoint_flags():
    """{flag: value} of the Dockerfile's exec-form ENTRYPOINT ({} without
    one; cmd_consistency reports that)."""
    docker = open(os.path.join(DEPLOY, "docker", "Dockerfile"),
                  encoding="utf-8").read()
    m = re.search(r"^ENTRYPOINT\s+(\[.*?\])\s*$", docker.replace("\\\n", " "),
                  re.M | re.S)
    return flag_args(json.loads(m.group(1))[1:]) if m else {}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


def fleet_problems(docs, entry, known):
    """overlays/fleet (raw files or rendered): a Deployment of stateless
    replicas on PostgreSQL beside the example store. docs: the resources."""
    problems = []

    def named(kind, name=None):
        return [d for d in docs if d.get("kind") == kind and
                (name is None or d["metadata"].get("name") == name)]

    deps = named("Deployment", "attnaudit")
    if named("StatefulSet", "attnaudit"):
        problems.append("the base's StatefulSet attnaudit is still there")
    if len(deps) != 1:
        return problems + ["expected one Deployment attnaudit, found %d"
                           % len(deps)]
    dep = deps[0]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    if not selects(spec.get("selector", {}).get("matchLabels"), pod_labels):
        problems.append("Deployment: selector does not match pod labels")
    if spec.get("replicas") != 3:
        problems.append("Deployment: replicas %r, want 3"
                        % spec.get("replicas"))
    pod_problems, ports, merged = server_pod_problems("Deployment", pod,
                                                      entry, known)
    problems += pod_problems
    c = (pod.get("containers") or [{}])[0]
    env = {e.get("name"): e for e in c.get("env", [])}

    def env_source(flag):
        m = re.fullmatch(r"\$\((\w+)\)", merged.get(flag, ""))
        return env.get(m.group(1), {}).get("valueFrom", {}) if m else {}

    ref = env_source("store").get("secretKeyRef", {})
    if (ref.get("name"), ref.get("key")) != ("attnaudit-store", "url"):
        problems.append("Deployment: --store is not $(VAR) of Secret "
                        "attnaudit-store key url")
    if env_source("replica-id").get("fieldRef", {}).get("fieldPath") != \
            "metadata.name":
        problems.append("Deployment: --replica-id is not $(VAR) of the "
                        "pod's metadata.name (downward API)")
    volumes = {v.get("name"): v for v in pod.get("volumes", [])}
    data = [m.get("name") for m in c.get("volumeMounts", [])
            if m.get("mountPath") == merged.get("data-dir")]
    if not data or "emptyDir" not in volumes.get(data[0], {}):
        problems.append("Deployment: the data dir (spool) is not an "
                        "emptyDir")
    services = named("Service")
    headless = [s for s in services
                if s["spec"].get("clusterIP") == "None" and
                selects(s["spec"].get("selector"), pod_labels)]
    if not any(p.get("port") == 50051 and
               p.get("targetPort") in ("grpc", 50051)
               for s in headless for p in s["spec"].get("ports", [])):
        problems.append("no headless Service with port 50051 over the "
                        "replicas")
    for pdb in named("PodDisruptionBudget"):
        if not selects(pdb["spec"].get("selector", {}).get("matchLabels"),
                       pod_labels):
            problems.append("PDB %s does not select the replicas"
                            % pdb["metadata"]["name"])
    secrets = {d["metadata"]["name"]: dict(d.get("stringData") or {},
                                           **(d.get("data") or {}))
               for d in named("Secret")}
    # The example store: a PostgreSQL 15 StatefulSet behind a headless
    # Service, on a PVC, reached by the Secret's url.
    pg = [d for d in named("StatefulSet")
          if str(d["spec"]["template"]["spec"]["containers"][0]
                 .get("image", "")).startswith("postgres:15")]
    if len(pg) != 1:
        return problems + ["expected one postgres:15 StatefulSet, found %d"
                           % len(pg)]
    pg = pg[0]
    pg_labels = pg["spec"]["template"]["metadata"].get("labels", {})
    pgc = pg["spec"]["template"]["spec"]["containers"][0]
    gov = [s for s in services
           if s["metadata"]["name"] == pg["spec"].get("serviceName")]
    if not gov or gov[0]["spec"].get("clusterIP") != "None" or \
            not selects(gov[0]["spec"].get("selector"), pg_labels):
        problems.append("postgres: serviceName is not a headless Service "
                        "selecting it")
    for s in services:
        sel = s["spec"].get("selector")
        if selects(sel, pod_labels) and selects(sel, pg_labels):
            problems.append("Service %s selects both the replicas and "
                            "PostgreSQL" % s["metadata"]["name"])
    claims = {t["metadata"]["name"]
              for t in pg["spec"].get("volumeClaimTemplates", [])}
    if not claims & {m.get("name") for m in pgc.get("volumeMounts", [])}:
        problems.append("postgres: data is not on a volumeClaimTemplate")
    pw = {e.get("name"): e for e in pgc.get("env", [])}.get(
        "POSTGRES_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if pw.get("key") not in secrets.get(pw.get("name"), {}):
        problems.append("postgres: POSTGRES_PASSWORD is not a key of a "
                        "Secret of the overlay")
    url = secrets.get("attnaudit-store", {}).get("url", "")
    m = re.match(r"postgres(?:ql)?://[^@/]*@([^:/?]+)(?::(\d+))?/\w+", url)
    if not m:
        problems.append("Secret attnaudit-store: url %r is not "
                        "postgresql://USER:PASSWORD@HOST:PORT/DB" % url)
    elif not any(s["metadata"]["name"] == m.group(1).split(".")[0] and
                 any(p.get("port") == int(m.group(2) or 5432)
                     for p in s["spec"].get("ports", []))
                 for s in gov):
        problems.append("Secret attnaudit-store: url host %s:%s is not the "
                        "example store's Service" % (m.group(1), m.group(2)))
    return problems


def cmd_consistency():
    try:
        import yaml
    except ImportError:
        print("consistency: PyYAML not installed (Debian: python3-yaml)")
        return 77
    problems = []
    known = server_flag_names()
    if len(known) < 20:
        return print("consistency: could not parse %s" % SERVER_FLAGS_CC) or 1

    def check_flags(where, flags):
        for k in flags:
            if k.replace("_", "-") not in known:
                problems.append("%s: --%s is not a server flag" % (where, k))

    # Dockerfile ENTRYPOINT.
    docker = open(os.path.join(DEPLOY, "docker", "Dockerfile"),
                  encoding="utf-8").read()
    m = re.search(r"^ENTRYPOINT\s+(\[.*?\])\s*$", docker.replace("\\\n", " "),
                  re.M | re.S)
    if not m:
        problems.append("Dockerfile: no exec-form ENTRYPOINT")
        entry = {}
    else:
        argv = json.loads(m.group(1))
        if argv[0] != "attnaudit-server":
            problems.append("Dockerfile: ENTRYPOINT is not attnaudit-server")
        entry = flag_args(argv[1:])
        check_flags("Dockerfile ENTRYPOINT", entry)
        for k, want in (("listen", "0.0.0.0:50051"),
                        ("metrics-listen", "0.0.0.0:9464"),
                        ("data-dir", "/var/lib/attnaudit")):
            if entry.get(k) != want:
                problems.append("Dockerfile: --%s is %r, want %r"
                                % (k, entry.get(k), want))
    # The build context: one ignore list for BuildKit (beside the
    # Dockerfile) and for the legacy builder (the context root's).
    ignore = os.path.join(DEPLOY, "docker", "Dockerfile.dockerignore")
    root_ignore = os.path.join(os.path.dirname(DEPLOY), ".dockerignore")
    if not os.path.exists(root_ignore) or \
            os.path.realpath(root_ignore) != os.path.realpath(ignore):
        problems.append(".dockerignore: not a link to deploy/docker/"
                        "Dockerfile.dockerignore (the legacy builder reads "
                        "only the context root's)")
    patterns = open(ignore, encoding="utf-8").read().split()
    for needed in (".git", "build", ".venv", "**/.venv"):
        if needed not in patterns:
            problems.append("Dockerfile.dockerignore: %s is not excluded"
                            % needed)
    if not re.search(r"^EXPOSE\s+50051\s+9464\s*$", docker, re.M):
        problems.append("Dockerfile: EXPOSE 50051 9464 missing")
    if not re.search(r"^USER\s+(?!0\b|root\b)\S+", docker, re.M):
        problems.append("Dockerfile: no non-root USER")

    # Compose.
    compose = yaml.safe_load(open(os.path.join(DEPLOY, "compose",
                                               "docker-compose.yml")))
    svc = compose.get("services", {}).get("attnaudit", {})
    cflags = flag_args(svc.get("command", []))
    check_flags("compose command", cflags)
    merged = dict(entry, **cflags)
    budget = seconds(merged.get("drain-delay", "0s")) + \
        seconds(merged.get("drain-timeout", "30s")) + TEARDOWN_S
    grace = seconds(svc.get("stop_grace_period", "10s"))
    if grace <= budget:
        problems.append("compose: stop_grace_period %gs <= drain budget %gs"
                        % (grace, budget))
    for name in ("prometheus", "grafana"):
        if name not in compose.get("services", {}):
            problems.append("compose: no %s service" % name)

    # Kubernetes: the CPU base and the resources the autoscaled overlay adds
    # (the rendered overlays are checked by check_k8s.sh).
    docs = {}
    for folder in ("base", os.path.join("overlays", "autoscaled")):
        d_path = os.path.join(DEPLOY, "k8s", folder)
        for f in sorted(os.listdir(d_path)):
            if not f.endswith(".yaml") or f == "kustomization.yaml" or \
                    f.startswith("prometheus-adapter"):
                continue
            for d in yaml.safe_load_all(open(os.path.join(d_path, f))):
                if d and "kind" in d:
                    docs.setdefault(d["kind"], []).append(d)
                    if d.get("metadata", {}).get("namespace"):
                        problems.append("k8s %s: hard-coded namespace" % f)
    sts = (docs.get("StatefulSet") or [None])[0]
    if sts is None:
        problems.append("k8s: no StatefulSet")
        sts = {"metadata": {}, "spec": {"template": {"metadata": {},
                                                     "spec": {}}}}
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    sel = spec.get("selector", {}).get("matchLabels", {})
    if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
        problems.append("StatefulSet: selector does not match pod labels")
    if not spec.get("volumeClaimTemplates"):
        problems.append("StatefulSet: no volumeClaimTemplates (per-replica "
                        "spool/store must survive restarts)")
    pod_problems, ports, merged = server_pod_problems("StatefulSet", pod,
                                                      entry, known)
    problems += pod_problems
    services = {s["metadata"]["name"]: s for s in docs.get("Service", [])}
    if spec.get("serviceName") not in services or \
            services[spec["serviceName"]]["spec"].get("clusterIP") != "None":
        problems.append("StatefulSet: serviceName is not a headless Service")
    if not any(s["spec"].get("clusterIP") != "None"
               for s in services.values()):
        problems.append("k8s: no regular (ClusterIP) Service")
    for name, s in services.items():
        ssel = s["spec"].get("selector", {})
        if not ssel or any(pod_labels.get(k) != v for k, v in ssel.items()):
            problems.append("Service %s: selector does not match the pods"
                            % name)
        for p in s["spec"].get("ports", []):
            if p.get("targetPort") not in ports and \
                    p.get("targetPort") not in ports.values():
                problems.append("Service %s: targetPort %r is no container "
                                "port" % (name, p.get("targetPort")))
    for pdb in docs.get("PodDisruptionBudget", []) or [None]:
        if pdb is None:
            problems.append("k8s: no PodDisruptionBudget")
            continue
        psel = pdb["spec"].get("selector", {}).get("matchLabels", {})
        if any(pod_labels.get(k) != v for k, v in psel.items()):
            problems.append("PDB: selector does not match the pods")
    for hpa in docs.get("HorizontalPodAutoscaler", []):
        ref = hpa["spec"]["scaleTargetRef"]
        if ref.get("kind") != "StatefulSet" or \
                ref.get("name") != sts["metadata"].get("name"):
            problems.append("HPA: does not target the StatefulSet")
        for m in hpa["spec"].get("metrics", []):
            name = m.get("pods", {}).get("metric", {}).get("name")
            if name and resolve(name, parse_families()) is None:
                problems.append("HPA: unknown metric %s" % name)
    # The fleet overlay from its files (check_k8s.py checks it rendered):
    # the base's Services and PDB, its Deployment, store and Secret.
    fleet_dir = os.path.join(DEPLOY, "k8s", "overlays", "fleet")
    fleet_docs = docs.get("Service", []) + docs.get("PodDisruptionBudget", [])
    for f in ("deployment.yaml", "postgres.yaml", "secret.yaml"):
        for d in yaml.safe_load_all(open(os.path.join(fleet_dir, f))):
            if d and "kind" in d:
                fleet_docs.append(d)
                if d.get("metadata", {}).get("namespace"):
                    problems.append("k8s fleet/%s: hard-coded namespace" % f)
    problems += ["fleet: " + p for p in fleet_problems(fleet_docs, entry,
                                                         known)]
    for p in problems:
        print("consistency: " + p)
    if not problems:
        print("consistency: flags known, shutdown budgets fit, probes/ports/"
              "selectors agree")
    return 1 if problems else 0


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    cmd = argv[0]
    fams = parse_families()
    if len(fams) < 10:
        print("could not parse the metric families of %s (found %d)"
              % (METRICS_H, len(fams)))
        return 1
    if cmd == "families":
        for k, (t, l) in sorted(fams.items()):
            print("%s %s {%s}" % (k, t, ",".join(sorted(l))))
        return 0
    if cmd == "dashboard":
        return cmd_dashboard(fams)
    if cmd == "alerts":
        return cmd_alerts(fams)
    if cmd == "store-dashboard":
        return cmd_store_dashboard()
    if cmd == "emit-rules" and len(argv) == 2:
        return cmd_emit_rules(argv[1])
    if cmd == "yaml":
        return cmd_yaml(argv[1:])
    if cmd == "consistency":
        return cmd_consistency()
    print("unknown command %r" % " ".join(argv))
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
