"""Schema validation of planned Kubernetes manifests.

Built-in kinds are checked by kubernetes-validate in strict mode (unknown fields are
errors) against the Kubernetes version GKE's channels run; custom resources against the
upstream CRDs (infra/crd_validation.py), CEL rules and defaults included.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Optional

import kubernetes_validate

from .crd_validation import CrdCatalog, crd_dir, load_catalog, validate_custom_resource

KUBERNETES_VERSION = "1.33.0"


def _where(path: Any) -> str:
    return ".".join(str(p) for p in path) or "<root>"


# API groups under k8s.io that are CRDs, not built into the API server.
CRD_GROUPS_UNDER_K8S_IO = frozenset({"gateway.networking.k8s.io", "inference.networking.k8s.io"})


def is_builtin(doc: dict[str, Any]) -> bool:
    """Core, apps, batch, *.k8s.io kinds; other dotted groups (and *.x-k8s.io) are custom resources."""
    group = doc.get("apiVersion", "").rpartition("/")[0]
    if group in CRD_GROUPS_UNDER_K8S_IO or group.endswith(".x-k8s.io"):
        return False
    return "." not in group or group.endswith(".k8s.io")


def catalog_or_none(directory: Optional[Path] = None) -> Optional[CrdCatalog]:
    path = directory or crd_dir()
    return load_catalog(path) if path else None


# Custom kinds the stacks emit whose upstream CRD the CRD folder does not hold yet, with where
# their pod templates are. Until it does, each template is checked as Kubernetes' own
# PodTemplateSpec and the rest against the fields and enums of the pinned CRD (kubernetes-sigs/lws
# v0.10.0 config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml: spec :17705-17812,
# leaderWorkerTemplate :8631-8697, rolloutStrategy :17734-17802); a held CRD replaces this.
UNHELD_CRDS: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"), ("spec", "leaderWorkerTemplate", "workerTemplate")),
}
_LWS_FIELDS: dict[tuple[str, ...], set[str]] = {
    ("spec",): {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"},
    ("spec", "leaderWorkerTemplate"): {"leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy",
                                       "volumeClaimTemplates", "persistentVolumeClaimRetentionPolicy"},
    ("spec", "rolloutStrategy"): {"type", "rollingUpdateConfiguration"},
    ("spec", "rolloutStrategy", "rollingUpdateConfiguration"): {"maxSurge", "maxUnavailable", "partition"},
}
_LWS_ENUMS: dict[tuple[str, ...], set[str]] = {
    ("spec", "startupPolicy"): {"LeaderCreated", "LeaderReady"},
    ("spec", "leaderWorkerTemplate", "restartPolicy"): {"Default", "RecreateGroupOnPodRestart",
                                                         "RecreateGroupAfterStart", "None"},
    ("spec", "rolloutStrategy", "type"): {"RollingUpdate"},
}


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def validate_unheld(doc: dict[str, Any]) -> list[str]:
    """A custom resource of an UNHELD_CRDS kind: its pod templates as Kubernetes validates a
    PodTemplateSpec (strict: unknown fields are errors), its own fields and enums as the pinned CRD."""
    errors: list[str] = []
    for path, allowed in _LWS_FIELDS.items():
        node = _at(doc, path)
        if isinstance(node, dict):
            errors += [f"{_where(path)}.{k}: not a field of the pinned CRD" for k in sorted(set(node) - allowed)]
    for path, values in _LWS_ENUMS.items():
        value = _at(doc, path)
        if value is not None and value not in values:
            errors.append(f"{_where(path)}: '{value}' is not one of {', '.join(sorted(values))}")
    size = _at(doc, ("spec", "leaderWorkerTemplate", "size"))
    if size is not None and (not isinstance(size, int) or size < 1):
        errors.append(f"spec.leaderWorkerTemplate.size: {size!r} is not an integer >= 1")
    for path in UNHELD_CRDS[(doc.get("apiVersion", ""), doc.get("kind", ""))]:
        template = _at(doc, path)
        if template is None:
            continue
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        try:
            kubernetes_validate.validate(wrapped, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{_where(path)}.{_where(list(exc.path)[1:])}: {exc.message}")
    return errors


def validate(doc: dict[str, Any], catalog: Optional[CrdCatalog] = None) -> list[str]:
    """Problems with one manifest; empty when it is valid. Custom resources need a catalog
    of upstream CRDs: without one they are not checked here (the plan says so)."""
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if not is_builtin(doc):
        if catalog is None:
            return []
        errors = validate_custom_resource(doc, catalog)
        if errors is None and (api_version, kind) in UNHELD_CRDS:
            return validate_unheld(doc)
        if errors is None:
            return [f"no upstream CRD for {api_version} {kind} in the CRD folder: add it there"]
        return errors
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema for {api_version} {kind} in Kubernetes {KUBERNETES_VERSION}"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{_where(exc.path)}: {exc.message}"]
    return []


def validate_dashboard(definition: dict[str, Any]) -> list[str]:
    """Parse the dashboard as the Cloud Monitoring API's own message: unknown fields are errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_dashboard_v1
    try:
        monitoring_dashboard_v1.Dashboard.from_json(json.dumps(definition))
    except Exception as exc:  # the proto parser raises ParseError subclasses of several kinds
        return [str(exc).splitlines()[0]]
    return []


def validate_alert_policy(policy: dict[str, Any]) -> list[str]:
    """Parse an alert policy (gcp.monitoring.AlertPolicy kwargs) as the API's own message."""
    from pydantic.alias_generators import to_camel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_v3

    def camel(value: Any) -> Any:
        if isinstance(value, dict):
            return {to_camel(k): camel(v) for k, v in value.items()}
        if isinstance(value, list):
            return [camel(v) for v in value]
        return value

    try:
        monitoring_v3.AlertPolicy.from_json(json.dumps(camel(policy)))
    except Exception as exc:  # the proto parser raises ParseError subclasses of several kinds
        return [f"{policy.get('display_name')}: {str(exc).splitlines()[0]}"]
    return []


def validate_slo(slo: dict[str, Any]) -> list[str]:
    """Parse an SLO (gcp.monitoring.Slo kwargs) as the API's own ServiceLevelObjective."""
    from pydantic.alias_generators import to_camel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_v3

    def camel(value: Any) -> Any:
        if isinstance(value, dict):
            return {to_camel(k): camel(v) for k, v in value.items()}
        return value

    message = camel({k: v for k, v in slo.items() if k != "slo_id"})
    message["serviceLevelIndicator"] = {"requestBased": message.pop("requestBasedSli")}
    message["rollingPeriod"] = f"{message.pop('rollingPeriodDays') * 86400}s"
    try:
        monitoring_v3.ServiceLevelObjective.from_json(json.dumps(message))
    except Exception as exc:  # the proto parser raises ParseError subclasses of several kinds
        return [f"{slo.get('display_name')}: {str(exc).splitlines()[0]}"]
    return []


def pod_templates(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) of a workload: a Deployment's one ("server"), or a LeaderWorkerSet's
    leader and worker templates."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [(role, lwt[key]) for role, key in (("leader", "leaderTemplate"), ("worker", "workerTemplate"))
                if key in lwt]
    return [("server", spec["template"])] if "template" in spec else []


def describe(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata", {})
    ns = meta.get("namespace")
    return f"{doc.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"
