#!/usr/bin/env bash
# The Kubernetes manifests as a cluster would receive them (ctest
# k8s_manifests_test): the CPU base (deploy/k8s) and the overlays
# deploy/k8s/overlays/{autoscaled,gpu,fleet} render with `kubectl
# kustomize`, pass `kubernetes-validate --strict`, and check_k8s.py checks
# what the schema cannot (the HPA's metric and the prometheus-adapter rule
# against server/metrics/metrics.h, the ServiceMonitor's selector and port,
# the GPU overlay's limits, placement and server flags, the fleet's
# Deployment, Secret, headless Service and example PostgreSQL).
#
# Tools: kubectl with kustomize v4 or later (`labels:` in the
# kustomizations). Debian 12's kubernetes-client is 1.20 with kustomize v2,
# too old; without a newer kubectl this test is SKIPPED (exit 77) and says
# so. kubernetes-validate comes from PyPI, pinned in requirements-k8s.txt,
# into VENV (created here, reused while the pins do not change).
#
# usage: check_k8s.sh REPO_ROOT VENV [PYTHON [PROMTOOL]]
# Output ends with "N passed, N failed"; exit 1 when anything failed.
set -u
ROOT=$1
VENV=$2
PYTHON=${3:-python3}
PROMTOOL=${4:-promtool}
cd "$ROOT" || exit 1
PASSED=0
FAILED=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

check() {  # NAME COMMAND...: exit 0 passes
  local name=$1
  shift
  if "$@" >"$TMP/out" 2>&1; then
    PASSED=$((PASSED + 1))
    echo "PASS  $name"
  else
    FAILED=$((FAILED + 1))
    echo "FAIL  $name"
    sed 's/^/      /' "$TMP/out" | head -40
  fi
}

KUBECTL=$(command -v kubectl || true)
kustomize_major=""
if [[ -n "$KUBECTL" ]]; then
  kustomize_major=$("$KUBECTL" version --client 2>/dev/null |
    sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p')
fi
if [[ -z "$KUBECTL" || -z "$kustomize_major" || "$kustomize_major" -lt 4 ]]; then
  echo "SKIPPED: needs kubectl with kustomize >= v4 (found: ${KUBECTL:-no kubectl}" \
       "${kustomize_major:+kustomize v$kustomize_major}); Debian 12's" \
       "kubernetes-client 1.20 embeds kustomize v2, which cannot render" \
       "these kustomizations"
  exit 77
fi

# kubernetes-validate in a venv with exact pins.
req=tests/deploy/requirements-k8s.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
if [[ ! -x "$VENV/bin/kubernetes-validate" ||
      "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]]; then
  rm -rf "$VENV"
  if ! { "$PYTHON" -m venv "$VENV" &&
         "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
           -r "$req"; } >"$TMP/venv.log" 2>&1; then
    echo "FAIL  kubernetes-validate venv from $req (PyPI)"
    sed 's/^/      /' "$TMP/venv.log" | tail -20
    echo "0 passed, 1 failed"
    exit 1
  fi
  echo "$want" >"$VENV/.requirements.sha256"
fi

for overlay in deploy/k8s deploy/k8s/overlays/autoscaled deploy/k8s/overlays/gpu \
               deploy/k8s/overlays/fleet; do
  name=$(basename "$overlay")
  [[ $name == k8s ]] && name=base
  out="$TMP/$name.yaml"
  check "kubectl kustomize $overlay" \
    bash -c '"$1" kustomize "$2" >"$3"' _ "$KUBECTL" "$overlay" "$out"
  # --strict rejects unknown fields; kinds without a schema (the
  # ServiceMonitor CRD) are only warned about, and check_k8s.py checks them.
  check "kubernetes-validate --strict ($name)" \
    "$VENV/bin/kubernetes-validate" --strict --quiet "$out"
  check "manifest checks ($name)" "$PYTHON" tests/deploy/check_k8s.py \
    "$name" "$out" --promtool "$PROMTOOL"
done

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
