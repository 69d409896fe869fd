#!/usr/bin/env bash
# Offline checks of deploy/ (registered with ctest as deploy_files_test):
#   promtool check rules / check config / test rules (alerts_test.yml),
#   the dashboard JSONs parse and are what dashboard_gen.py generates, the
#   store dashboard uses its provisioned PostgreSQL datasource, the on-call
#   dashboard follows the datasource/variable conventions and its PromQL
#   parses (promtool) and names only families and labels of
#   server/metrics/metrics.h (as do the alerts), every compose/k8s/
#   Prometheus/Grafana YAML parses, and the Dockerfile/compose/StatefulSet
#   and the fleet overlay's Deployment agree with the server's flags and
#   shutdown budget.
# A missing tool (promtool, python3, PyYAML) fails its checks: nothing is
# skipped. ctest passes the tools the configure step found as PROMTOOL and
# PYTHON (defaults: promtool, python3 on PATH).
# Usage: tests/deploy/check_deploy.sh [REPO_ROOT]
# Output ends with "N passed, N failed"; exit status 1 when anything failed.
set -u

ROOT=${1:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"}
cd "$ROOT" || { echo "cannot cd to $ROOT"; echo "0 passed, 1 failed"; exit 1; }

PROMTOOL=${PROMTOOL:-promtool}
PYTHON=${PYTHON:-python3}
PASSED=0
FAILED=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# check NAME COMMAND...: exit 0 passes; anything else fails (77 from
# check_deploy.py: a module it needs is missing) and prints the output.
check() {
  local name=$1
  shift
  local rc=0
  "$@" >"$TMP/out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    PASSED=$((PASSED + 1))
    echo "PASS  $name"
    return 0
  else
    FAILED=$((FAILED + 1))
    echo "FAIL  $name (exit $rc)"
  fi
  sed 's/^/      /' "$TMP/out"
}

# missing NAME WHY: a check that cannot run because its tool is missing.
missing() {
  FAILED=$((FAILED + 1))
  echo "FAIL  $1: $2"
}

HAVE_PROMTOOL=1
command -v "$PROMTOOL" >/dev/null 2>&1 || HAVE_PROMTOOL=0
HAVE_PYTHON=1
command -v "$PYTHON" >/dev/null 2>&1 || HAVE_PYTHON=0
PY=tests/deploy/check_deploy.py

# --- Prometheus rules and config -------------------------------------------
if [ "$HAVE_PROMTOOL" -eq 1 ]; then
  check "promtool check rules deploy/prometheus/alerts.yml" \
    "$PROMTOOL" check rules deploy/prometheus/alerts.yml
  # Also resolves rule_files (alerts.yml) relative to the config.
  check "promtool check config deploy/prometheus/prometheus.yml" \
    "$PROMTOOL" check config deploy/prometheus/prometheus.yml
  check "promtool test rules tests/deploy/alerts_test.yml" \
    "$PROMTOOL" test rules tests/deploy/alerts_test.yml
else
  for c in "check rules" "check config" "test rules"; do
    missing "promtool $c" "promtool not found (Debian package: prometheus)"
  done
fi

# --- Dashboard ---------------------------------------------------------------
if [ "$HAVE_PYTHON" -eq 1 ]; then
  check "dashboard JSONs parse" "$PYTHON" -c \
    'import json, sys; [json.load(open(p, encoding="utf-8")) for p in sys.argv[1:]]' \
    deploy/grafana/dashboards/attnaudit.json \
    deploy/grafana/dashboards/attnaudit-store.json
  check "dashboard JSONs are up to date with dashboard_gen.py" \
    "$PYTHON" deploy/grafana/dashboard_gen.py --check
  check "dashboard conventions and metric/label names vs metrics.h" \
    "$PYTHON" "$PY" dashboard
  # Its SQL runs against PostgreSQL in store_panels_test.py.
  check "store dashboard vs its PostgreSQL datasource" \
    "$PYTHON" "$PY" store-dashboard
  if [ "$HAVE_PROMTOOL" -eq 1 ]; then
    "$PYTHON" "$PY" emit-rules "$TMP/dashboard_rules.yml" >/dev/null 2>&1
    check "dashboard PromQL parses (promtool check rules)" \
      "$PROMTOOL" check rules "$TMP/dashboard_rules.yml"
  else
    missing "dashboard PromQL parses" "promtool not found"
  fi
  check "alert metric/label names vs metrics.h" "$PYTHON" "$PY" alerts

  # --- YAML and cross-file consistency ---------------------------------------
  YAML_FILES=(deploy/compose/*.yml deploy/k8s/*.yaml deploy/k8s/base/*.yaml
              deploy/k8s/overlays/*/*.yaml
              deploy/prometheus/*.yml
              deploy/grafana/provisioning/datasources/*.yml
              deploy/grafana/provisioning/dashboards/*.yml
              tests/deploy/alerts_test.yml)
  check "YAML parses (${#YAML_FILES[@]} files)" "$PYTHON" "$PY" yaml "${YAML_FILES[@]}"
  check "flags, shutdown budgets, probes, selectors agree" \
    "$PYTHON" "$PY" consistency
else
  missing "dashboard and YAML checks" "python3 not found"
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
