"""Schema validation of planned Kubernetes manifests.

Built-in kinds are checked by kubernetes-validate in strict mode (unknown fields are
errors) against the Kubernetes version GKE's channels run; custom resources against the
structural schemas in crd_schemas.py.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jsonschema
import kubernetes_validate

from infra.crd_schemas import SCHEMAS

KUBERNETES_VERSION = "1.33.0"


@lru_cache(maxsize=None)
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(SCHEMAS[(api_version, kind)])


def _where(path: Any) -> str:
    return ".".join(str(p) for p in path) or "<root>"


def validate(doc: dict[str, Any]) -> list[str]:
    """Problems with one manifest; empty when it is valid."""
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if (api_version, kind) in SCHEMAS:
        errors = sorted(_crd_validator(api_version, kind).iter_errors(doc), key=lambda e: list(e.path))
        return [f"{_where(e.path)}: {e.message}" for e in errors]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema for {api_version} {kind}: add one to infra/crd_schemas.py"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{_where(exc.path)}: {exc.message}"]
    return []


def validate_dashboard(definition: dict[str, Any]) -> list[str]:
    """Parse the dashboard as the Cloud Monitoring API's own message: unknown fields are errors."""
    import json
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import monitoring_dashboard_v1
    try:
        monitoring_dashboard_v1.Dashboard.from_json(json.dumps(definition))
    except Exception as exc:  # the proto parser raises ParseError subclasses of several kinds
        return [str(exc).splitlines()[0]]
    return []


def describe(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata", {})
    ns = meta.get("namespace")
    return f"{doc.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"
