"""The Cloud Run models' load balancer (components/model/cloud_run_gateway.py): a regional class
reaches only its own region's serverless NEGs, HTTPS needs the hostname its certificate is issued
for, and that hostname is not the Gateway's (two load balancers cannot answer one name). An auth jwt
model needs its Cloud Armor policy (a request without a well-formed bearer JWT would otherwise start
an instance), which Google documents custom rules and rate limiting for on external Application Load
Balancers only: with the internal class such a model is refused (infra/contracts/cloud_run_gateway.py)."""

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
        if model.auth == "jwt" and not kind.external:
            add(f"{key}.auth", f"auth jwt turns Cloud Run's invoker check off, so a request without a valid token "
                "would start a GPU instance (a cold start, then billed until it idles out) before the guard refuses "
                "it; the Cloud Armor policy that refuses such requests at the load balancer needs an external "
                f"class, and gateway.className {cfg.gateway.class_name} is internal (Cloud Armor's custom rules and "
                "rate limiting are documented for external Application Load Balancers only); use auth iam (Cloud "
                "Run's invoker check refuses unverified callers before an instance starts), or an external "
                "gateway.className")
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
