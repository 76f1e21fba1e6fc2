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
from pydantic.alias_generators import to_camel

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


# Custom kinds neither published as a CRD source nor dumped into ../shared/upstream-crds: each is
# checked field by field by the named test against GKE's own reference instead (datreeio's dump of
# the cluster's schema, read there, not copied here); the plan lists them as not schema-checked.
UNPUBLISHED_CRDS: dict[tuple[str, str], str] = {
    ("networking.gke.io/v1", "GCPRoutingExtension"):
        "GKE publishes no CRD source and the CRD folder holds no dump of it; its fields are checked in "
        "tests/test_inference_gateway.py (test_the_identity_extension_fronts_the_gateway_failing_closed)",
}


def unpublished(doc: dict[str, Any]) -> Optional[str]:
    """Why a custom resource has no CRD to be checked against, for the kinds UNPUBLISHED_CRDS names."""
    return UNPUBLISHED_CRDS.get((doc.get("apiVersion", ""), doc.get("kind", "")))


def catalog_or_none(directory: Optional[Path] = None) -> Optional[CrdCatalog]:
    path = directory or crd_dir()
    return load_catalog(path) if path else None


def validate(doc: dict[str, Any], catalog: Optional[CrdCatalog] = None) -> list[str]:
    """Problems with one manifest; empty when it is valid. Custom resources need a catalog
    of upstream CRDs: without one they are not checked here (the plan says so)."""
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if not is_builtin(doc):
        if catalog is None:
            return []
        errors = validate_custom_resource(doc, catalog)
        if errors is None and unpublished(doc):
            return []
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


def _camel(value: Any) -> Any:
    """Pulumi's snake_case kwargs as the API's JSON names."""
    if isinstance(value, dict):
        return {to_camel(k): _camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def validate_dashboard(definition: dict[str, Any]) -> list[str]:
    """Parse the dashboard as the Cloud Monitoring API's own message: unknown fields are errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_dashboard_v1  # lazy: ~0.7 s of protos only the plan's checks need
    try:
        monitoring_dashboard_v1.Dashboard.from_json(json.dumps(definition))
    except Exception as exc:  # the proto parser raises ParseError subclasses of several kinds
        return [str(exc).splitlines()[0]]
    return []


def validate_alert_policy(policy: dict[str, Any]) -> list[str]:
    """Parse an alert policy (gcp.monitoring.AlertPolicy kwargs) as the API's own message."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_v3  # lazy: ~0.7 s of protos only the plan's checks need

    try:
        monitoring_v3.AlertPolicy.from_json(json.dumps(_camel(policy)))
    except Exception as exc:  # the proto parser raises ParseError subclasses of several kinds
        return [f"{policy.get('display_name')}: {str(exc).splitlines()[0]}"]
    return []


def validate_slo(slo: dict[str, Any]) -> list[str]:
    """Parse an SLO (gcp.monitoring.Slo kwargs) as the API's own ServiceLevelObjective."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_v3  # lazy: ~0.7 s of protos only the plan's checks need

    message = _camel({k: v for k, v in slo.items() if k != "slo_id"})
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
