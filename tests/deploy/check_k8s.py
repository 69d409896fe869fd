#!/usr/bin/env python3
"""What the Kubernetes schema cannot check in a rendered kustomization
(called by check_k8s.sh with the output of `kubectl kustomize`):

  check_k8s.py base|autoscaled|gpu|fleet RENDERED.yaml [--promtool PROMTOOL]

every variant: no hard-coded namespace; one server workload "attnaudit"
  (a StatefulSet; the fleet's is a Deployment) whose args use only server
  flags (server/main/server_flags.cc);
autoscaled: an HPA on the StatefulSet whose Pods metric is the one the
  prometheus-adapter rule serves, a metric of server/metrics/metrics.h with
  the label the HPA selects; the rule's metricsQuery parses as PromQL
  (promtool) once its template is filled; a ServiceMonitor that selects the
  Service carrying the metrics port;
gpu: nvidia.com/gpu in the container's limits, a GPU node selector, a
  toleration for the GPU taint, one pod per node, --devices=all;
fleet: check_deploy.fleet_problems on the rendered resources: the base's
  StatefulSet is gone, a Deployment of 3 replicas with --store from Secret
  attnaudit-store key url and --replica-id from the pod name, the spool on
  an emptyDir, a headless Service over the replicas, the shutdown budget,
  and the example PostgreSQL 15 StatefulSet (headless Service, PVC, the
  Secret's url pointing at it).
Prints one line per problem; exit 0 when there is none, 1 otherwise.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_deploy  # noqa: E402

ADAPTER_VALUES = os.path.join(check_deploy.DEPLOY, "k8s", "overlays",
                              "autoscaled", "prometheus-adapter-values.yaml")


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def container(sts):
    return sts["spec"]["template"]["spec"]["containers"][0]


def check_common(docs, problems, kind="StatefulSet"):
    """The server workload (kind, named attnaudit), or None."""
    for d in docs:
        if d.get("metadata", {}).get("namespace"):
            problems.append("%s/%s: hard-coded namespace" % (
                d["kind"], d["metadata"]["name"]))
    found = [d for d in docs if d.get("kind") in ("StatefulSet", "Deployment")
             and d.get("metadata", {}).get("name") == "attnaudit"]
    if len(found) != 1 or found[0]["kind"] != kind:
        problems.append("expected one %s attnaudit, found %s" % (
            kind, ", ".join(d["kind"] for d in found) or "none"))
        return None
    known = check_deploy.server_flag_names()
    for flag in check_deploy.flag_args(container(found[0]).get("args", [])):
        if flag not in known:
            problems.append("%s: --%s is not a server flag" % (kind, flag))
    return found[0]


def adapter_rule_metric(problems, promtool):
    """The metric name the adapter serves; checks its rule."""
    rules = yaml.safe_load(open(ADAPTER_VALUES))["rules"]["custom"]
    if len(rules) != 1:
        problems.append("adapter: expected one custom rule")
        return None
    rule = rules[0]
    m = re.match(r"([a-z_:][a-z0-9_:]*)\{", rule["seriesQuery"])
    fams = check_deploy.parse_families()
    if not m or check_deploy.resolve(m.group(1), fams) is None:
        problems.append("adapter: seriesQuery names no metric of metrics.h: "
                        + rule["seriesQuery"])
    overrides = rule.get("resources", {}).get("overrides", {})
    if set(overrides) != {"namespace", "pod"}:
        problems.append("adapter: resources must map namespace and pod")
    # Fill the adapter's template as it would for one pod, then parse.
    query = (rule["metricsQuery"]
             .replace("<<.Series>>", m.group(1) if m else "x")
             .replace("<<.LabelMatchers>>", 'namespace="ns",pod="attnaudit-0"')
             .replace("<<.GroupBy>>", "pod"))
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "adapter", "rules": [
            {"record": "adapter:check", "expr": query}]}]}, f)
        path = f.name
    try:
        p = subprocess.run([promtool, "check", "rules", path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if p.returncode != 0:
            problems.append("adapter: metricsQuery does not parse: %s\n%s" %
                            (query, p.stdout))
    finally:
        os.unlink(path)
    return rule.get("name", {}).get("as")


def check_autoscaled(docs, sts, problems, promtool):
    served = adapter_rule_metric(problems, promtool)
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    if len(hpas) != 1:
        problems.append("expected one HorizontalPodAutoscaler")
    fams = check_deploy.parse_families()
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        if (ref.get("kind"), ref.get("name")) != ("StatefulSet",
                                                   sts["metadata"]["name"]):
            problems.append("HPA: does not scale the StatefulSet")
        for metric in hpa["spec"].get("metrics", []):
            pods = metric.get("pods", {}).get("metric", {})
            name = pods.get("name")
            if name != served:
                problems.append("HPA: metric %s is not the one the adapter "
                                "serves (%s)" % (name, served))
            labels = check_deploy.resolve(name or "", fams)
            for label in pods.get("selector", {}).get("matchLabels", {}):
                if labels is None or label not in labels[0]:
                    problems.append("HPA: %s has no label %s" % (name, label))
    monitors = by_kind(docs, "ServiceMonitor")
    if len(monitors) != 1:
        problems.append("expected one ServiceMonitor")
    services = by_kind(docs, "Service")
    for sm in monitors:
        sel = sm["spec"]["selector"].get("matchLabels", {})
        chosen = [s for s in services if all(
            s["metadata"].get("labels", {}).get(k) == v
            for k, v in sel.items())]
        ports = {p.get("name") for s in chosen for p in s["spec"]["ports"]}
        if not chosen:
            problems.append("ServiceMonitor: selects no Service")
        for ep in sm["spec"].get("endpoints", []):
            if ep.get("port") not in ports:
                problems.append("ServiceMonitor: port %s is not on the "
                                "selected Service" % ep.get("port"))


def check_gpu(sts, problems):
    pod = sts["spec"]["template"]["spec"]
    limits = container(sts).get("resources", {}).get("limits", {})
    if not str(limits.get("nvidia.com/gpu", "")).isdigit():
        problems.append("gpu: no nvidia.com/gpu limit")
    if not any(k.startswith("nvidia.com/gpu")
               for k in pod.get("nodeSelector", {})):
        problems.append("gpu: no GPU node selector")
    if not any(t.get("key") == "nvidia.com/gpu"
               for t in pod.get("tolerations", [])):
        problems.append("gpu: no toleration for nvidia.com/gpu")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
    if not any(a.get("topologyKey") == "kubernetes.io/hostname"
               for a in anti):
        problems.append("gpu: pods are not one per node")
    args = check_deploy.flag_args(container(sts).get("args", []))
    if args.get("devices") != "all":
        problems.append("gpu: the server is not given --devices=all")


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("variant",
                        choices=("base", "autoscaled", "gpu", "fleet"))
    parser.add_argument("rendered")
    parser.add_argument("--promtool", default="promtool")
    args = parser.parse_args(argv)
    docs = [d for d in yaml.safe_load_all(open(args.rendered)) if d]
    problems = []
    sts = check_common(docs, problems, "Deployment"
                       if args.variant == "fleet" else "StatefulSet")
    if sts is not None and args.variant == "fleet":
        problems += check_deploy.fleet_problems(
            docs, check_deploy.entrypoint_flags(),
            check_deploy.server_flag_names())
    if sts is not None and args.variant == "autoscaled":
        check_autoscaled(docs, sts, problems, args.promtool)
    if sts is not None and args.variant == "gpu":
        check_gpu(sts, problems)
    if sts is not None and args.variant != "gpu" and \
            "nvidia.com/gpu" in str(container(sts).get("resources")):
        problems.append("%s: asks for GPUs" % args.variant)
    for p in problems:
        print(p)
    if not problems:
        print("%s: %d resources checked" % (args.variant, len(docs)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
