"""GKE Volume Populator: the data source, annotation, transfer pool and version it needs."""

from __future__ import annotations

from ...components.hyperdisk_weights import CPU_REQUEST_ANNOTATION
from ...components.model.hyperdisk_ml import MIN_GKE as POPULATOR_MIN_GKE
from ...components.model.hyperdisk_ml import TRANSFER_COMPUTE_CLASS
from ...components.model.k8s_objects import COMPUTE_CLASS_LABEL
from ...components.model.specs import gke_version
from ..plan import Plan
from .base import Contract, _docs


def populator_inputs(plan: Plan) -> list[str]:
    out = []
    sources = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in _docs(plan, "GCPDataSource")}
    for claim in _docs(plan, "PersistentVolumeClaim"):
        ref = claim["spec"].get("dataSourceRef") or {}
        if ref.get("kind") != "GCPDataSource":
            continue
        name = claim["metadata"]["name"]
        source = sources.get((claim["metadata"]["namespace"], ref.get("name")))
        if source is None:
            out.append(f"claim {name}: its GCPDataSource is not in the claim's namespace")
            continue
        storage = source["spec"].get("cloudStorage") or {}
        if not str(storage.get("uri", "")).endswith("/") or not storage.get("serviceAccountName"):
            out.append(f"claim {name}: the data source needs a gs:// folder (trailing /) and a service account")
        if CPU_REQUEST_ANNOTATION not in (claim["metadata"].get("annotations") or {}):
            out.append(f"claim {name}: no {CPU_REQUEST_ANNOTATION}: the transfer sizes itself for the default node")
    if sources:
        pools = [r.props for r in plan.of_type("gcp:container/nodePool:NodePool")]
        if not any(((p.get("nodeConfig") or {}).get("labels") or {}).get(COMPUTE_CLASS_LABEL) == TRANSFER_COMPUTE_CLASS
                   for p in pools):
            out.append(f"no node pool labelled {COMPUTE_CLASS_LABEL}={TRANSFER_COMPUTE_CLASS} for the transfer Jobs")
        version = plan.config.cluster.min_master_version
        if version is None or (gke_version(version) or (0,)) < (gke_version(POPULATOR_MIN_GKE) or (0,)):
            out.append(f"cluster.minMasterVersion {version}: Volume Populator needs {POPULATOR_MIN_GKE} or later")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("GKE Volume Populator", "GKE-managed",
             "a GCPDataSource (cloudStorage uri of a folder, serviceAccountName) beside its claim; transfer Jobs "
             "on nodes of compute class gcs-to-hdml-compute-class, sized by volume-populator.datalayer.gke.io/"
             f"cpu-request; GKE {POPULATOR_MIN_GKE} or later",
             "https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/volume-populator-hdml",
             "each claim's data source, annotation, the transfer pool's label and the version floor",
             populator_inputs),
)
