"""The Cloud Run models' load balancer (components/model/cloud_run_gateway.py): a regional class
reaches only its own region's serverless NEGs, HTTPS needs the hostname its certificate is issued
for, and that hostname is not the Gateway's (two load balancers cannot answer one name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cloud_run_gateway import LB_OF_CLASS, NAME_LIMIT, backend_name, cloud_run_tls
from ..specs.base import item_key
from .base import Add

if TYPE_CHECKING:
    from ..stack_config import StackConfig


def cloud_run_gateway(cfg: "StackConfig", add: Add) -> None:
    if cfg.cloud_run is None:
        return
    models = cfg.cloud_run.models
    kind = LB_OF_CLASS[cfg.gateway.class_name]
    for i, model in enumerate(models):
        key = f"cloudRun.{item_key('models', models, i)}"
        if kind.regional and (region := cfg.cloud_run_region(model)) != cfg.region:
            add(f"{key}.region", f"'{region}' is not the stack's region ({cfg.region}): the Cloud Run models sit behind "
                f"a load balancer of gateway.className {cfg.gateway.class_name}, which is regional and reaches "
                f"serverless NEGs in its own region only; remove region (or set it to {cfg.region}), or use "
                "gateway.className gke-l7-global-external-managed")
        if len(name := backend_name(cfg, model.name)) > NAME_LIMIT:
            add(f"{key}.name", f"the serverless NEG and backend service '{name}' would exceed GCP's {NAME_LIMIT} "
                f"characters; shorten the model (or cluster.name) by {len(name) - NAME_LIMIT}")
    _hostname(cfg, add)


def _hostname(cfg: "StackConfig", add: Add) -> None:
    assert cfg.cloud_run is not None
    hostname = cfg.cloud_run.hostname
    if cloud_run_tls(cfg) and not hostname:
        why = "is external" if cfg.gateway.external else "serves HTTPS"
        add("cloudRun.hostname", f"the gateway ({cfg.gateway.class_name}) {why}, so the Cloud Run models' load "
            "balancer does too, with a Google-managed certificate issued for this name: set the DNS name clients "
            "call the Cloud Run models at (not gateway.hostname)")
    elif hostname and hostname == cfg.gateway.hostname:
        add("cloudRun.hostname", f"'{hostname}' is gateway.hostname: the Cloud Run models have a load balancer "
            "(and address) of their own beside the Gateway, so they need a name of their own (e.g. "
            f"run.{hostname}); tenants' URLs keep the same paths under it")
