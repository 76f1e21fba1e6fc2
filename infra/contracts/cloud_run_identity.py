"""Who a request on a Cloud Run model is (images/vllm_gke_guard/cloud_run.py): what Cloud Run's invoker
check does with the request's credential headers, and a check of each on the plan's services."""

from __future__ import annotations

import json
from typing import Any

from ...components.model.cloud_run_tenancy import id_token_audience
from ..plan import Plan
from .base import Contract

SERVICE_TO_SERVICE = "https://cloud.google.com/run/docs/authenticating/service-to-service"
SIGNATURE_REMOVED = "https://cloud.google.com/run/docs/troubleshooting#signature-removed"
INVOKER_IAM_DISABLED = "https://cloud.google.com/run/docs/securing/managing-access#invoker_check"
CUSTOM_AUDIENCES = "https://cloud.google.com/run/docs/configuring/custom-audiences"
SERVICE = "gcp:cloudrunv2/service:Service"
GUARD_ENV = "GKE_LLM_GUARD_CONFIG"


def _guarded_services(plan: Plan) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, props, the guard's config) of each Cloud Run service whose container runs the guard."""
    out = []
    for r in plan.of_type(SERVICE):
        for c in (r.props.get("template") or {}).get("containers") or []:
            for e in c.get("envs") or []:
                if e.get("name") == GUARD_ENV and isinstance(e.get("value"), str):
                    out.append((str(r.props.get("name")), r.props, json.loads(e["value"])))
    return out


def cloud_run_iam_identity_is_the_checked_token(plan: Plan) -> list[str]:
    """Under auth iam the invoker check is on (Cloud Run verifies the token the guard then reads)."""
    return [f"Cloud Run service {name}: its guard reads the account from the token Cloud Run verified, but the "
            "invoker check is off: nothing verified it"
            for name, props, guard in _guarded_services(plan)
            if (guard.get("cloudRun") or {}).get("auth") == "iam" and props.get("invokerIamDisabled")]


def cloud_run_guard_trusts_no_peer(plan: Plan) -> list[str]:
    """Every guarded Cloud Run service's guard tells the tenant itself (a `cloudRun` section) and trusts no
    peer address or mesh header: no sidecar verified anything before it."""
    out = []
    for name, _props, guard in _guarded_services(plan):
        identity = guard.get("cloudRun") or {}
        if identity.get("auth") not in ("jwt", "iam"):
            out.append(f"Cloud Run service {name}: its guard config has no cloudRun identity: the mesh's checks it "
                       "relies on on GKE do not exist here")
        if guard.get("trustedPeers"):
            out.append(f"Cloud Run service {name}: its guard trusts peers {guard['trustedPeers']}, but Cloud Run's "
                       "front end is every client's peer")
        if identity.get("auth") == "jwt" and not identity.get("tenants") and guard.get("issuers"):
            out.append(f"Cloud Run service {name}: auth jwt with no tenant's issuer and keys to verify tokens by")
    return out


def cloud_run_iam_audience_is_the_tenants(plan: Plan) -> list[str]:
    """Under auth iam each service's custom audiences are the one its tenants mint tokens for (the plan's
    tenant URLs print it), and its run.app URL (the other audience Cloud Run accepts) is off."""
    models = {m.name: m for m in plan.config.cloud_run_models}
    out = []
    for name, props, guard in _guarded_services(plan):
        model = models.get(str(guard.get("model")))
        if model is None or (guard.get("cloudRun") or {}).get("auth") != "iam":
            continue
        want = [id_token_audience(plan.config, model)]
        if list(props.get("customAudiences") or []) != want:
            out.append(f"Cloud Run service {name}: custom audiences {props.get('customAudiences')}, but its tenants "
                       f"mint their ID tokens for {want[0]} (the plan's tenant URLs): Cloud Run refuses them")
        if props.get("defaultUriDisabled") is not True:
            out.append(f"Cloud Run service {name}: its run.app URL is on, a way in that skips the load balancer")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Cloud Run (invoker check)", "Cloud Run Admin API v2",
             "a caller sends its Google ID token as 'Authorization: Bearer' or 'X-Serverless-Authorization: Bearer' "
             "(\"If both headers are provided, only the X-Serverless-Authorization header is checked\"); Cloud Run "
             "hands the token it accepted on to the container with its signature replaced by "
             "SIGNATURE_REMOVED_BY_GOOGLE, the other header as sent",
             f"{SERVICE_TO_SERVICE} (Acquire the token); {SIGNATURE_REMOVED}",
             "under auth iam the guard reads X-Serverless-Authorization when present, else Authorization, takes only "
             "a token whose signature Cloud Run removed, maps its email to one tenant, and refuses both headers at "
             "once; the service's invoker check stays on",
             cloud_run_iam_identity_is_the_checked_token),
    Contract("Cloud Run (invoker check off)", "Cloud Run Admin API v2",
             "with the invoker IAM check disabled Cloud Run admits every request that reaches its ingress and checks "
             "no credential; requests reach the container from Cloud Run's front end, so the peer address names no "
             "client and no header is verified",
             f"{INVOKER_IAM_DISABLED}; {SERVICE_TO_SERVICE}",
             "a Cloud Run model's guard trusts no peer and no mesh header (it refuses the mesh's identity headers); "
             "under auth jwt it verifies the tenant's token itself against the issuer's JWKS",
             cloud_run_guard_trusts_no_peer),
    Contract("Cloud Run (custom audiences)", "Cloud Run Admin API v2",
             "an IAM-protected service accepts an ID token whose aud is its run.app URL or one of its custom "
             "audiences (any strings, e.g. a URL the client knows, set on the service and kept by every revision); "
             "for clients behind a load balancer or custom domain, which do not know the run.app URL",
             f"{CUSTOM_AUDIENCES}; pulumi_gcp 10.2.0 cloudrunv2.Service custom_audiences",
             "auth iam: custom_audiences is the model's base URL on the Cloud Run load balancer "
             "(<scheme>://<cloudRun.hostname>/<model>; <cluster>-run/<model> without a hostname), which the plan's "
             "tenant URLs and the guide tell the tenant to mint its token for; run.app URL off",
             cloud_run_iam_audience_is_the_tenants),
)
