#!/usr/bin/env python3
"""Every SQL panel of deploy/grafana/dashboards/attnaudit-store.json against a
real PostgreSQL holding known job rows (ctest store_panels_test).

ctest runs it under `pg_virtualenv -v 15`, which starts a throwaway cluster
and exports PGHOST, PGPORT, PGUSER and PGPASSWORD; by hand:

    pg_virtualenv -v 15 python3 tests/deploy/store_panels_test.py

1. The schema below is a literal copy of kSchemaV1 and the columns later
   migrations add (kSchemaV2, ...: ALTER TABLE ... ADD COLUMN) in
   server/store/postgres_job_store.cc (the server creates them at start).
   The test parses that file and fails, naming the column, when a table or
   a column (its name or its declaration) differs from the copy, or when
   the schema version is not the copy's: update the copy, the rows and the
   panels.
2. It creates the schema in a fresh database and inserts realistic rows:
   PASS, DRIFT with several diagnoses (and one without), INVALID, FAILED,
   CANCELLED, unfinished QUEUED/RUNNING jobs, several tenants, models,
   layers, steps and replicas, one DRIFT outside the last 24 hours and one
   older than the dashboard's range.
3. For several variable selections and time ranges it expands each panel's
   SQL the way Grafana does -- the frontend's template variables (a custom
   allValue is inserted raw, a multi/include-All value becomes a quoted
   list, $__interval from the scoped variables), then the backend's
   $__interval / $__unixEpochFrom() replacement and its macro regex, which
   ends a macro's argument at the first ")" -- runs it with psql as a
   read-only role holding SELECT on attnaudit_jobs only (what
   provisioning/datasources/attnaudit-store.yml recommends), and compares
   the rows with what a plain Python filter of the inserted rows expects.
   The template variables' own queries are checked the same way.

Standard library and the psql client only. Exit 0 when everything matches,
1 otherwise (every mismatch is printed), 77 without a cluster (PGHOST unset).
"""
import csv
import datetime as dt
import io
import json
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "dashboards",
                         "attnaudit-store.json")
STORE_CC = os.path.join(ROOT, "server", "store", "postgres_job_store.cc")
STORE_H = os.path.join(ROOT, "server", "store", "postgres_job_store.h")
PG_TYPES = ("grafana-postgresql-datasource", "postgres")

# Mirrors kSchemaV1 of server/store/postgres_job_store.cc, the columns
# kSchemaV2 adds, the pair tables of kSchemaV3 (no panel reads them), and
# the version table its migration creates first. Keep it a literal copy:
# check_schema() compares the tables and columns with that file.
SCHEMA_VERSION = 3
SCHEMA = """
CREATE TABLE IF NOT EXISTS attnaudit_schema (version INTEGER NOT NULL);
CREATE TABLE attnaudit_jobs (
  job_id        TEXT PRIMARY KEY,
  tenant        TEXT NOT NULL DEFAULT 'default',
  state         TEXT NOT NULL,
  verdict       INTEGER NOT NULL DEFAULT 0,
  priority      INTEGER NOT NULL DEFAULT 1,
  model         TEXT NOT NULL DEFAULT '',
  layer         BIGINT NOT NULL DEFAULT -1,
  engine        TEXT NOT NULL DEFAULT '',
  backend       TEXT NOT NULL DEFAULT '',
  step          BIGINT NOT NULL DEFAULT -1,
  run           TEXT NOT NULL DEFAULT '',
  diagnosis     TEXT NOT NULL DEFAULT '',
  replica       TEXT NOT NULL DEFAULT '',
  created_us    BIGINT NOT NULL DEFAULT 0,
  started_us    BIGINT NOT NULL DEFAULT 0,
  finished_us   BIGINT NOT NULL DEFAULT 0,
  error_code    INTEGER NOT NULL DEFAULT 0,
  error_message TEXT NOT NULL DEFAULT '',
  report        BYTEA,
  seq           BIGINT NOT NULL DEFAULT 0,
  bytes         BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX attnaudit_jobs_by_seq ON attnaudit_jobs(seq);
CREATE INDEX attnaudit_jobs_by_created ON attnaudit_jobs(created_us, job_id);
CREATE INDEX attnaudit_jobs_by_finished ON attnaudit_jobs(finished_us, job_id);
CREATE INDEX attnaudit_jobs_unfinished ON attnaudit_jobs(replica, created_us)
  WHERE state IN ('QUEUED', 'RUNNING');
CREATE TABLE attnaudit_counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO attnaudit_counters(name, value) VALUES('seq', 0);
CREATE TABLE attnaudit_secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL);
CREATE TABLE attnaudit_payloads (
  job_id      TEXT PRIMARY KEY,
  deadline_us BIGINT NOT NULL,
  payload     BYTEA NOT NULL
);
CREATE TABLE attnaudit_replicas (
  replica      TEXT PRIMARY KEY,
  heartbeat_us BIGINT NOT NULL
);
ALTER TABLE attnaudit_jobs ADD COLUMN tenant_seq BIGINT NOT NULL DEFAULT 0;
CREATE TABLE attnaudit_pair_sides (
  job_id         TEXT PRIMARY KEY,
  tenant         TEXT NOT NULL,
  run            TEXT NOT NULL,
  layer          BIGINT NOT NULL,
  role           INTEGER NOT NULL,
  step           BIGINT NOT NULL DEFAULT -1,
  weight_version TEXT NOT NULL DEFAULT '',
  snapshot       BYTEA NOT NULL,
  report         BYTEA NOT NULL,
  expires_us     BIGINT NOT NULL,
  put_seq        BIGSERIAL
);
CREATE TABLE attnaudit_pair_side_rows (
  job_id     TEXT NOT NULL
             REFERENCES attnaudit_pair_sides(job_id) ON DELETE CASCADE,
  request_id TEXT NOT NULL,
  position   BIGINT NOT NULL,
  tenant     TEXT NOT NULL,
  run        TEXT NOT NULL,
  layer      BIGINT NOT NULL,
  role       INTEGER NOT NULL
);
CREATE TABLE attnaudit_pairs (
  seq                    BIGINT PRIMARY KEY,
  tenant                 TEXT NOT NULL,
  run                    TEXT NOT NULL,
  layer                  BIGINT NOT NULL,
  rollout_job            TEXT NOT NULL,
  trainer_job            TEXT NOT NULL,
  rollout_step           BIGINT NOT NULL,
  trainer_step           BIGINT NOT NULL,
  rollout_weight_version TEXT NOT NULL,
  trainer_weight_version TEXT NOT NULL,
  verdict                INTEGER NOT NULL,
  report                 BYTEA,
  replica                TEXT NOT NULL,
  joined_us              BIGINT NOT NULL
);
CREATE TABLE attnaudit_pair_request_ids (
  seq        BIGINT NOT NULL REFERENCES attnaudit_pairs(seq) ON DELETE CASCADE,
  request_id TEXT NOT NULL
);
"""

# The role Grafana's datasource should use (attnaudit-store.yml).
READER = "attnaudit_grafana"
READER_PASSWORD = "panels-test"
DATABASE = "attnaudit_store_panels"

PASS, DRIFT, INVALID = 1, 2, 3
TERMINAL = ("DONE", "FAILED", "CANCELLED")
ALL = "$__all"  # Grafana's value of a selected "All"

# "now" of the whole test: every relative time range and row is placed
# from it. Whole seconds, as Grafana's ranges are in milliseconds.
NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)

R0 = "attnaudit-6d9f8b7c5-2xkqp"
R1 = "attnaudit-6d9f8b7c5-h7v4n"
R2 = "attnaudit-6d9f8b7c5-w9mzt"


def job(job_id, tenant, state, verdict, model, layer, step, replica, ago,
        diagnosis="", engine="vllm", backend="flash-attn",
        run="grpo-qwen3-r14", error=(0, ""), priority=1):
    """One row; `ago` is how long before NOW it finished (None: unfinished).
    Finish times carry sub-second parts, as the server's do."""
    finished = NOW - ago if ago is not None else None
    created = (finished or NOW) - dt.timedelta(seconds=42, microseconds=250)
    if finished is not None:
        finished += dt.timedelta(microseconds=137000)
    started = created + dt.timedelta(seconds=3) if state != "QUEUED" else None
    return {"job_id": job_id, "tenant": tenant, "state": state,
            "verdict": verdict, "priority": priority, "model": model,
            "layer": layer, "engine": engine, "backend": backend,
            "step": step, "run": run, "diagnosis": diagnosis,
            "replica": replica, "created_us": us(created),
            "started_us": us(started) if started else 0,
            "finished_us": us(finished) if finished else 0,
            "error_code": error[0], "error_message": error[1]}


def us(t):
    return int(round(t.timestamp() * 1e6))


L3, Q8 = "llama3-8b", "qwen3-8b"
ROWS = [
    job("j01", "default", "DONE", PASS, L3, 3, 1200, R0, 50 * MIN),
    job("j02", "default", "DONE", DRIFT, L3, 3, 1200, R0, 45 * MIN,
        diagnosis="stale-page"),
    job("j03", "team-rl", "DONE", DRIFT, Q8, 17, 1201, R1, 30 * MIN,
        diagnosis="rope-offset", engine="sglang", backend="flashinfer"),
    job("j04", "default", "DONE", DRIFT, L3, 3, 1201, R2, 20 * MIN,
        diagnosis="stale-page"),
    # Same finish time as j04: newest-first order breaks the tie by job_id.
    job("j15", "team-rl", "DONE", DRIFT, Q8, 17, 1202, R2, 20 * MIN,
        diagnosis="rope-offset", engine="sglang", backend="flashinfer"),
    job("j05", "default", "DONE", DRIFT, L3, 12, 1201, R1, 10 * MIN,
        diagnosis="unexplained", run="grpo-llama-r3"),
    job("j06", "team-rl", "DONE", PASS, Q8, 17, 1201, R2, 5 * MIN,
        engine="sglang", backend="flashinfer"),
    job("j07", "default", "FAILED", 0, L3, 12, 1202, R0, 4 * MIN,
        error=(13, "device lost")),
    job("j08", "team-rl", "CANCELLED", 0, Q8, 5, 1202, R1, 3 * MIN,
        error=(1, "cancelled by the client")),
    job("j09", "default", "DONE", INVALID, L3, -1, -1, R2, 2 * MIN,
        engine="", backend=""),
    # A DRIFT the audit did not diagnose, on an engine without a backend.
    job("j14", "default", "DONE", DRIFT, L3, 12, 1202, R2, 1 * MIN,
        engine="hf-eager", backend=""),
    # Two days ago: in the dashboard's 7 days, not in "last 24h".
    job("j10", "team-rl", "DONE", DRIFT, Q8, 5, 1190, R0, 2 * DAY,
        diagnosis="stale-page"),
    # Older than the dashboard's range.
    job("j11", "default", "DONE", DRIFT, L3, 3, 1100, R1, 9 * DAY,
        diagnosis="lse-base2"),
    # Unfinished: never on a panel.
    job("j12", "default", "QUEUED", 0, L3, 7, 1203, R0, None),
    job("j13", "team-rl", "RUNNING", 0, Q8, 7, 1203, R1, None),
    # An interactive Audit's stored result (no replica recorded).
    job("j16", "default", "DONE", PASS, L3, 7, 1203, "", 30 * HOUR,
        priority=0),
]


# ------------------------------------------------------------ schema ----
def schema_tables(sql):
    """{table: [(column, declaration)]} of the CREATE TABLE and ALTER TABLE
    ... ADD COLUMN statements, in order."""
    tables = {}
    for m in re.finditer(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)\s*\((.*?)\);"
                         r"|ALTER TABLE (\w+) ADD COLUMN (\w+) ([^;]*);",
                         sql, re.S | re.I):
        if m.group(3):
            tables.setdefault(m.group(3), []).append(
                (m.group(4), " ".join(m.group(5).split())))
            continue
        cols = []
        for part in split_top_level(m.group(2)):
            part = " ".join(part.split())
            if not part:
                continue
            name, _, decl = part.partition(" ")
            cols.append((name, decl))
        tables[m.group(1)] = cols
    return tables


def split_top_level(body):
    out, depth, cur = [], 0, ""
    for c in body:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    out.append(cur)
    return out


def check_schema():
    problems = []
    try:
        cc = open(STORE_CC, encoding="utf-8").read()
    except OSError as e:
        return ["cannot read %s: %s" % (STORE_CC, e)]
    versions = re.findall(r'kSchemaV(\d+)\s*=\s*R"(\w*)\((.*?)\)\2"', cc,
                          re.S)
    if not versions or versions[0][0] != "1":
        return ["%s: no kSchemaV1 raw string literal found; update this "
                "test's SCHEMA copy" % os.path.relpath(STORE_CC, ROOT)]
    server_sql = "\n".join(sql for _, _, sql in versions)
    server = schema_tables(server_sql)
    # The version table is created by the migration itself.
    vm = re.search(r"CREATE TABLE IF NOT EXISTS attnaudit_schema\s*\"?\s*"
                   r"\"?\s*\(([^)]*)\)", cc)
    if vm:
        server["attnaudit_schema"] = schema_tables(
            "CREATE TABLE attnaudit_schema (%s);" % vm.group(1))[
                "attnaudit_schema"]
    else:
        problems.append("%s: creates no attnaudit_schema version table"
                        % os.path.relpath(STORE_CC, ROOT))
    ours = schema_tables(SCHEMA)
    where = os.path.relpath(STORE_CC, ROOT)
    for table in sorted(set(ours) | set(server)):
        if table not in server:
            problems.append("%s: no table %s (this test's copy has it)"
                            % (where, table))
            continue
        if table not in ours:
            problems.append("%s: new table %s, not in this test's copy"
                            % (where, table))
            continue
        a, b = dict(ours[table]), dict(server[table])
        for col in [c for c, _ in ours[table]]:
            if col not in b:
                problems.append("%s: %s has no column %s" % (where, table,
                                                            col))
            elif a[col] != b[col]:
                problems.append("%s: %s.%s is `%s`, this test's copy says "
                                "`%s`" % (where, table, col, b[col], a[col]))
        for col in [c for c, _ in server[table]]:
            if col not in a:
                problems.append("%s: new column %s.%s, not in this test's "
                                "copy" % (where, table, col))
        # And plainly: every column this test (and the dashboard) relies on
        # is still spelled in the server's schema.
        for col in a:
            if not re.search(r"\b%s\b" % re.escape(col), server_sql) and \
                    table != "attnaudit_schema":
                problems.append("%s: column name %s does not occur in "
                                "the kSchemaV* migrations" % (where, col))
    try:
        h = open(STORE_H, encoding="utf-8").read()
        vm = re.search(r"kPostgresSchemaVersion\s*=\s*(\d+)", h + cc)
        if not vm:
            problems.append("kPostgresSchemaVersion not found in %s"
                            % os.path.relpath(STORE_H, ROOT))
        elif int(vm.group(1)) != SCHEMA_VERSION:
            problems.append("kPostgresSchemaVersion is %s, this test mirrors "
                            "version %d" % (vm.group(1), SCHEMA_VERSION))
    except OSError as e:
        problems.append("cannot read %s: %s" % (STORE_H, e))
    return problems


# ---------------------------------------------------------------- psql ----
def psql(sql, db=DATABASE, reader=False):
    """Rows of one statement as a list of dicts (header from psql --csv)."""
    env = dict(os.environ, PGTZ="UTC", PGDATABASE=db,
               PGAPPNAME="store_panels_test")
    if reader:
        env.update(PGUSER=READER, PGPASSWORD=READER_PASSWORD)
    p = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--csv",
                        "-c", sql], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("psql failed (%d): %s\n--- SQL ---\n%s"
                           % (p.returncode, p.stderr.strip(), sql))
    if not p.stdout.strip():
        return []
    return list(csv.DictReader(io.StringIO(p.stdout)))


def psql_script(sql, db):
    env = dict(os.environ, PGDATABASE=db)
    p = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f",
                        "-"], input=sql, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("psql script failed: %s" % p.stderr.strip())


def literal(v):
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def setup_database():
    psql("DROP DATABASE IF EXISTS %s" % DATABASE, db="postgres")
    psql("CREATE DATABASE %s" % DATABASE, db="postgres")
    cols = list(ROWS[0])
    values = ",\n".join("(%s)" % ", ".join(literal(r[c]) for c in cols)
                        for r in ROWS)
    # seq: commit order of the terminal rows, as PutResult numbers them.
    terminal = sorted((r for r in ROWS if r["state"] in TERMINAL),
                      key=lambda r: (r["finished_us"], r["job_id"]))
    seq = {r["job_id"]: i + 1 for i, r in enumerate(terminal)}
    seq_sql = "\n".join("UPDATE attnaudit_jobs SET seq = %d WHERE job_id = "
                        "'%s';" % (n, j) for j, n in seq.items())
    psql_script(
        SCHEMA +
        "INSERT INTO attnaudit_schema(version) VALUES (%d);\n" %
        SCHEMA_VERSION +
        "INSERT INTO attnaudit_jobs(%s) VALUES\n%s;\n" % (", ".join(cols),
                                                         values) +
        seq_sql + "\nUPDATE attnaudit_counters SET value = %d;\n" % len(seq) +
        "INSERT INTO attnaudit_secrets VALUES ('job-id-key', "
        "'\\x00112233'::bytea);\n"
        # The read-only role of attnaudit-store.yml.
        "DROP ROLE IF EXISTS %s;\n" % READER +
        "CREATE ROLE %s LOGIN PASSWORD '%s';\n" % (READER, READER_PASSWORD) +
        "ALTER ROLE %s SET default_transaction_read_only = on;\n" % READER +
        "GRANT SELECT ON attnaudit_jobs TO %s;\n" % READER, db=DATABASE)


# ------------------------------------------- Grafana's interpolation ----
# Frontend: templateSrv's variable regex ($var, [[var]], [[var:fmt]],
# ${var}, ${var.field}, ${var:fmt}).
VAR_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|"
                    r"\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")
# Backend (pkg/tsdb/grafana-postgresql-datasource/macros.go): the argument
# list stops at the first ")".
MACRO_RE = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")


def quote_literal(v):
    return "'" + str(v).replace("'", "''") + "'"


def interpolate_variable(value, var):
    """SqlDatasource.interpolateVariable."""
    if isinstance(value, str):
        if var.get("multi") or var.get("includeAll"):
            return quote_literal(value)
        return value.replace("'", "''")
    if isinstance(value, (int, float)):
        return str(value)
    return ",".join(quote_literal(v) for v in value)


def expand_variables(sql, variables, selection, options, scoped):
    """templateSrv.replace(sql, scopedVars, interpolateVariable).
    variables: {name: definition}; selection: {name: value or ALL};
    options: {name: [values the variable's query returned]}."""

    def repl(m):
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in scoped:
            return scoped[name]
        var = variables.get(name)
        if var is None:
            return m.group(0)  # not a variable: a macro such as $__timeFilter
        if fmt or m.group(5):
            raise ValueError("variable format/field ${%s...} is not "
                             "emulated by this test" % name)
        value = selection[name]
        if value == ALL or value == [ALL]:
            if var.get("allValue"):
                # A custom allValue is inserted as is, then re-expanded.
                return expand_variables(var["allValue"], variables,
                                        selection, options, scoped)
            value = options[name]
        return interpolate_variable(value, var)

    return VAR_RE.sub(repl, sql)


def rfc3339nano(t):
    """Go's time.RFC3339Nano of a UTC time: trailing zeros dropped."""
    s = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        s += ("." + "%06d" % t.microsecond).rstrip("0")
    return s + "Z"


def go_float(x):
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def parse_interval(s):
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w|y)", s.strip().strip("'"))
    if not m:
        raise ValueError("error parsing interval %s" % s)
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600,
                              "d": 86400, "w": 604800,
                              "y": 31536000}[m.group(2)]


def format_interval(seconds):
    """gtime.FormatInterval."""
    for unit, size in (("y", 31536000), ("d", 86400), ("h", 3600),
                       ("m", 60), ("s", 1)):
        if seconds >= size:
            return "%d%s" % (seconds // size, unit)
    return "%dms" % max(1, int(seconds * 1000))


def expand_macros(sql, t_from, t_to, interval_s):
    """sqleng.Interpolate, then the PostgreSQL macro engine."""
    sql = sql.replace("$__interval_ms", str(int(interval_s * 1000)))
    sql = sql.replace("$__interval", format_interval(interval_s))
    sql = sql.replace("$__unixEpochFrom()", str(int(t_from.timestamp())))
    sql = sql.replace("$__unixEpochTo()", str(int(t_to.timestamp())))
    original = sql
    errors = []

    def macro(m):
        name = m.group(1)
        if name == "__timeGroup":
            # Pre-5.3 compatibility: a "," right after the macro adds AS time.
            i = original.find(m.group(0))
            if i >= 0 and original[i + len(m.group(0)):][:1] == ",":
                name = "__timeGroupAlias"
        args = [a.strip(" ") for a in m.group(2).split(",")]
        try:
            return evaluate(name, args)
        except ValueError as e:
            errors.append(str(e))
            return "macro_error()"

    def evaluate(name, args):
        if name == "__time":
            return '%s AS "time"' % args[0]
        if name == "__timeEpoch":
            return 'extract(epoch from %s) as "time"' % args[0]
        if name == "__timeFilter":
            if not args[0]:
                raise ValueError("missing time column argument for macro %s"
                                 % name)
            return "%s BETWEEN '%s' AND '%s'" % (
                args[0], rfc3339nano(t_from), rfc3339nano(t_to))
        if name == "__timeFrom":
            return "'%s'" % rfc3339nano(t_from)
        if name == "__timeTo":
            return "'%s'" % rfc3339nano(t_to)
        if name in ("__timeGroup", "__timeGroupAlias"):
            if len(args) < 2:
                raise ValueError("macro %s needs time column and interval"
                                 % name)
            if len(args) == 3:
                raise ValueError("fill modes are not emulated by this test")
            sec = go_float(parse_interval(args[1]))
            tg = "floor(extract(epoch from %s)/%s)*%s" % (args[0], sec, sec)
            return tg + (' AS "time"' if name == "__timeGroupAlias" else "")
        if name == "__unixEpochFilter":
            return "%s >= %d AND %s <= %d" % (
                args[0], int(t_from.timestamp()), args[0],
                int(t_to.timestamp()))
        raise ValueError("unknown macro %r" % name)

    sql = MACRO_RE.sub(macro, sql)
    if errors:
        raise ValueError("; ".join(errors))
    return sql


def grafana_sql(raw, dashboard, selection, options, t_from, t_to,
                interval_s):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    scoped = {"__interval": format_interval(interval_s),
              "__interval_ms": str(int(interval_s * 1000))}
    sql = expand_variables(raw, variables, selection, options, scoped)
    return expand_macros(sql, t_from, t_to, interval_s)


def relative(expr):
    """'now', 'now-7d', '24h' (a panel's timeFrom) -> datetime."""
    m = re.fullmatch(r"(?:now-?)?(\d*)([smhdw]?)", expr)
    if expr == "now":
        return NOW
    if not m or not m.group(1):
        raise ValueError("time %r is not emulated" % expr)
    return NOW - dt.timedelta(seconds=parse_interval(m.group(1) +
                                                     m.group(2)))


def self_check():
    """The emulation reproduces Grafana's known quirks."""
    problems = []
    t0, t1 = NOW - HOUR, NOW
    got = expand_macros("WHERE $__timeFilter(to_timestamp(x / 1e6))", t0, t1,
                        60)
    if "to_timestamp(x / 1e6 BETWEEN" not in got:
        problems.append("macro regex: a nested call should break the "
                        "argument at its first ')', got %r" % got)
    got = expand_macros("SELECT $__timeGroupAlias(t, '5m')", t0, t1, 60)
    if got != 'SELECT floor(extract(epoch from t)/300)*300 AS "time"':
        problems.append("$__timeGroupAlias: %r" % got)
    var = {"x": {"name": "x", "multi": True, "includeAll": True,
                 "allValue": "'__all__'"}}
    got = expand_variables("IN ($x)", var, {"x": ["o'k", "b"]}, {}, {})
    if got != "IN ('o''k','b')":
        problems.append("multi value: %r" % got)
    got = expand_variables("IN ($x)", var, {"x": [ALL]}, {}, {})
    if got != "IN ('__all__')":
        problems.append("custom allValue: %r" % got)
    return problems


# ---------------------------------------------------- expectations ----
def selected(rows, selection, t_from, t_to, drift_only=False):
    """The inserted rows a panel should see."""
    lo, hi = us(t_from), us(t_to)
    out = []
    for r in rows:
        if r["state"] not in TERMINAL:
            continue
        if not lo <= r["finished_us"] <= hi:
            continue
        for name in ("tenant", "model"):
            want = selection[name]
            if want not in (ALL, [ALL]) and r[name] not in want:
                break
        else:
            if drift_only and not (r["state"] == "DONE" and
                                   r["verdict"] == DRIFT):
                continue
            out.append(r)
    return out


def close_time(text, want_us):
    """psql's timestamptz text (UTC) vs microseconds: within 1 ms."""
    t = dt.datetime.fromisoformat(text.replace("+00", "+00:00"))
    return abs(us(t) - want_us) <= 1000


def layer_label(layer):
    return "no layer" if layer < 0 else "layer %d" % layer


def check_latest(rows, ctx):
    problems = []
    if ctx["limit"] is None:
        problems.append("no LIMIT: the table would load every DRIFT row")
    want = sorted(selected(ROWS, ctx["selection"], ctx["from"], ctx["to"],
                           True),
                  key=lambda r: (r["finished_us"], r["job_id"]),
                  reverse=True)[:ctx["limit"]]
    got_ids = [r.get("job_id") for r in rows]
    want_ids = [r["job_id"] for r in want]
    if got_ids != want_ids:
        return problems + ["job_id order %s, want %s" % (got_ids,
                                                         want_ids)]
    expect_cols = ["finished", "model", "layer", "engine/backend", "step",
                   "run", "diagnosis", "replica", "tenant", "job_id"]
    if rows and list(rows[0]) != expect_cols:
        problems.append("columns %s, want %s" % (list(rows[0]),
                                                 expect_cols))
    for g, w in zip(rows, want):
        eb = "/".join(x for x in (w["engine"], w["backend"]) if x)
        for col, val in (("model", w["model"]), ("layer", str(w["layer"])),
                         ("engine/backend", eb), ("step", str(w["step"])),
                         ("run", w["run"]), ("diagnosis", w["diagnosis"]),
                         ("replica", w["replica"]),
                         ("tenant", w["tenant"])):
            if g.get(col) != val:
                problems.append("%s: %s is %r, want %r"
                                % (w["job_id"], col, g.get(col), val))
        if not close_time(g.get("finished", ""), w["finished_us"]):
            problems.append("%s: finished %r, want %s" % (
                w["job_id"], g.get("finished"),
                dt.datetime.fromtimestamp(w["finished_us"] / 1e6,
                                          dt.timezone.utc)))
    return problems


def check_over_time(rows, ctx):
    step = ctx["interval"]
    want = {}
    for r in selected(ROWS, ctx["selection"], ctx["from"], ctx["to"], True):
        bucket = (r["finished_us"] // 1000000) // step * step
        key = (bucket, layer_label(r["layer"]))
        want[key] = want.get(key, 0) + 1
    got = {}
    problems = []
    times = []
    for g in rows:
        if set(g) != {"time", "metric", "drift"}:
            return ["columns %s, want time, metric, drift" % list(g)]
        t = float(g["time"])
        times.append(t)
        got[(int(t), g["metric"])] = int(g["drift"])
    if times != sorted(times):
        problems.append("time column not ascending: %s" % times)
    if got != want:
        problems.append("buckets %s, want %s" % (sorted(got.items()),
                                                 sorted(want.items())))
    return problems


def check_over_steps(rows, ctx):
    want = {}
    for r in selected(ROWS, ctx["selection"], ctx["from"], ctx["to"], True):
        key = (r["step"], r["layer"])
        want[key] = want.get(key, 0) + 1
    want_rows = [(s, layer_label(l), n) for (s, l), n in
                 sorted(want.items(), key=lambda kv: (-kv[0][0], kv[0][1]))]
    got_rows = []
    for g in rows:
        if list(g) != ["step", "layer", "drift"]:
            return ["columns %s, want step, layer, drift" % list(g)]
        got_rows.append((int(g["step"]), g["layer"], int(g["drift"])))
    if got_rows != want_rows:
        return ["rows %s, want %s" % (got_rows, want_rows)]
    return []


def check_per_replica(rows, ctx):
    cols = ["PASS", "DRIFT", "INVALID", "FAILED", "CANCELLED"]
    want = {}
    for r in selected(ROWS, ctx["selection"], ctx["from"], ctx["to"]):
        name = r["replica"] or "(unknown)"
        counts = want.setdefault(name, dict.fromkeys(cols, 0))
        if r["state"] == "DONE":
            counts[{PASS: "PASS", DRIFT: "DRIFT",
                    INVALID: "INVALID"}[r["verdict"]]] += 1
        else:
            counts[r["state"]] += 1
    want_rows = [[name] + [want[name][c] for c in cols]
                 for name in sorted(want)]
    got_rows = []
    for g in rows:
        if list(g) != ["replica"] + cols:
            return ["columns %s, want %s" % (list(g), ["replica"] + cols)]
        got_rows.append([g["replica"]] + [int(g[c]) for c in cols])
    if got_rows != want_rows:
        return ["rows %s, want %s" % (got_rows, want_rows)]
    return []


def check_diagnoses(rows, ctx):
    # The last 24 hours whatever the dashboard's range (the panel's timeFrom).
    want = {}
    for r in selected(ROWS, ctx["selection"], NOW - DAY, NOW, True):
        name = r["diagnosis"] or "(none)"
        want[name] = want.get(name, 0) + 1
    want_rows = sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))
    got_rows = []
    for g in rows:
        if list(g) != ["diagnosis", "drift"]:
            return ["columns %s, want diagnosis, drift" % list(g)]
        got_rows.append((g["diagnosis"], int(g["drift"])))
    if got_rows != want_rows:
        return ["rows %s, want %s" % (got_rows, want_rows)]
    return []


CHECKS = {
    "Latest DRIFT audits": check_latest,
    "DRIFT by layer over time": check_over_time,
    "DRIFT by layer over steps": check_over_steps,
    "Verdicts per replica": check_per_replica,
    "Diagnoses (last 24h)": check_diagnoses,
}

# Variable selections x dashboard time ranges x $__interval.
SCENARIOS = [
    ("All tenants, all models, 7 days",
     {"tenant": [ALL], "model": [ALL]}, "now-7d", 3600),
    ("tenant team-rl", {"tenant": ["team-rl"], "model": [ALL]}, "now-7d",
     3600),
    ("model llama3-8b", {"tenant": [ALL], "model": [L3]}, "now-7d", 600),
    ("both tenants, model qwen3-8b",
     {"tenant": ["default", "team-rl"], "model": [Q8]}, "now-7d", 3600),
    ("last 30 minutes", {"tenant": [ALL], "model": [ALL]}, "now-30m", 300),
    ("last 12 hours, both models", {"tenant": [ALL], "model": [L3, Q8]},
     "now-12h", 1800),
    ("a tenant with no rows", {"tenant": ["nobody"], "model": [ALL]},
     "now-7d", 3600),
]


def store_panels(dashboard):
    out = []

    def walk(panels):
        for p in panels:
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            out.append(p)
    walk(dashboard.get("panels", []))
    return out


def is_sql_target(panel, target):
    ds = target.get("datasource") or panel.get("datasource") or {}
    return ds.get("type") in PG_TYPES


def static_checks(dashboard):
    problems = []
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for need in ("tenant", "model"):
        if need not in variables:
            problems.append("no %r template variable" % need)
    titles = []
    for p in store_panels(dashboard):
        targets = [t for t in p.get("targets", []) if is_sql_target(p, t)]
        if not targets:
            problems.append("panel %r: no PostgreSQL target" % p["title"])
            continue
        titles.append(p["title"])
        for t in targets:
            sql = t.get("rawSql", "")
            if not t.get("rawQuery") or not sql:
                problems.append("panel %r: target %s is not raw SQL"
                                % (p["title"], t.get("refId")))
            if not re.search(r"state IN \('DONE', 'FAILED', 'CANCELLED'\)",
                             sql):
                problems.append("panel %r: not limited to terminal rows"
                                % p["title"])
            if "$__timeFilter(" not in sql:
                problems.append("panel %r: no $__timeFilter" % p["title"])
            for var in ("tenant", "model"):
                if "$" + var not in sql:
                    problems.append("panel %r: ignores $%s"
                                    % (p["title"], var))
            if re.search(r"\$__\w+\([^)]*\(", sql):
                problems.append("panel %r: a macro argument holds a call; "
                                "Grafana's macro regex cuts it at the first "
                                "')'" % p["title"])
    for title in titles:
        if title not in CHECKS:
            problems.append("panel %r has no expectation in this test"
                            % title)
    for title in CHECKS:
        if title not in titles:
            problems.append("panel %r is missing from the dashboard" % title)
    return problems


def variable_options(dashboard, selection, problems):
    """Runs the query variables (in order, each seeing the ones before) and
    checks them; returns {name: [values]}."""
    options = {}
    t_from, t_to = relative(dashboard["time"]["from"]), NOW
    for v in dashboard["templating"]["list"]:
        if v.get("type") != "query":
            continue
        q = v["query"] if isinstance(v["query"], str) else \
            v["query"].get("rawSql", v["query"].get("query", ""))
        sql = grafana_sql(q, dashboard, selection, options, t_from, t_to,
                          60)
        rows = psql(sql, reader=True)
        values = [list(r.values())[0] for r in rows]
        options[v["name"]] = values
        if v["name"] == "tenant":
            want = sorted({r["tenant"] for r in ROWS
                           if r["state"] in TERMINAL})
        elif v["name"] == "model":
            want = sorted({r["model"] for r in ROWS
                           if r["state"] in TERMINAL and r["model"] and
                           (selection["tenant"] in (ALL, [ALL]) or
                            r["tenant"] in selection["tenant"])})
        else:
            continue
        if values != want:
            problems.append("variable %s (tenant=%s): %s, want %s"
                            % (v["name"], selection["tenant"], values, want))
    return options


def main():
    if not os.environ.get("PGHOST"):
        print("SKIPPED: no PostgreSQL cluster (PGHOST unset); run under "
              "pg_virtualenv -v 15, as ctest does")
        return 77
    problems = []
    for p in check_schema():
        problems.append("schema: " + p)
    for p in self_check():
        problems.append("emulation: " + p)
    dashboard = json.load(open(DASHBOARD, encoding="utf-8"))
    for p in static_checks(dashboard):
        problems.append("dashboard: " + p)
    setup_database()
    print("database %s: %d rows, read as role %s" % (DATABASE, len(ROWS),
                                                      READER))
    # The reader sees the job rows only: not the server's keys, not the
    # acknowledged snapshots.
    for table in ("attnaudit_secrets", "attnaudit_payloads"):
        try:
            psql("SELECT count(*) FROM %s" % table, reader=True)
            problems.append("role %s can read %s" % (READER, table))
        except RuntimeError:
            pass
    for sel in ({"tenant": [ALL], "model": [ALL]},
                {"tenant": ["team-rl"], "model": [ALL]}):
        variable_options(dashboard, sel, problems)
    checked = 0
    for name, selection, range_from, interval in SCENARIOS:
        options = variable_options(dashboard, selection, [])
        for panel in store_panels(dashboard):
            check = CHECKS.get(panel["title"])
            if check is None:
                continue
            t_from = relative(panel["timeFrom"]) if panel.get("timeFrom") \
                else relative(range_from)
            if panel.get("timeShift"):
                problems.append("panel %r: timeShift is not emulated"
                                % panel["title"])
            for target in panel["targets"]:
                if not is_sql_target(panel, target):
                    continue
                where = "[%s] panel %r" % (name, panel["title"])
                try:
                    sql = grafana_sql(target["rawSql"], dashboard, selection,
                                      options, t_from, NOW, interval)
                    rows = psql(sql, reader=True)
                except (RuntimeError, ValueError) as e:
                    problems.append("%s: %s" % (where, e))
                    continue
                m = re.search(r"\bLIMIT (\d+)\s*$", sql)
                ctx = {"selection": selection, "from": t_from, "to": NOW,
                       "interval": interval,
                       "limit": int(m.group(1)) if m else None}
                found = check(rows, ctx)
                for p in found:
                    problems.append("%s: %s" % (where, p))
                checked += 1
                if not found:
                    print("ok   %s: %d rows" % (where, len(rows)))
    # A sanity anchor independent of the expectation code: the default view.
    latest = [p for p in store_panels(dashboard)
              if p["title"] == "Latest DRIFT audits"]
    try:
        sql = grafana_sql(latest[0]["targets"][0]["rawSql"], dashboard,
                          {"tenant": [ALL], "model": [ALL]}, {},
                          relative(dashboard["time"]["from"]), NOW, 3600)
        ids = [r.get("job_id") for r in psql(sql, reader=True)]
        if ids != ["j14", "j05", "j15", "j04", "j03", "j02", "j10"]:
            problems.append("Latest DRIFT audits, default view: %s" % ids)
    except (IndexError, KeyError, RuntimeError, ValueError) as e:
        problems.append("Latest DRIFT audits, default view: %s" % e)
    for p in problems:
        print("FAIL " + p)
    print("%d panel queries checked, %d problems" % (checked, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("FAIL %s" % e)
        sys.exit(1)
