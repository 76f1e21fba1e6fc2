"""The Istio sidecar (managed Cloud Service Mesh): the peer address and claim header the guard
trusts, a sidecar that outlives vLLM, and request principals that are exactly a tenant's."""

from __future__ import annotations

import json

from ...components.model.k8s_objects import TENANT_LABEL
from ...components.model.serving_api import SIDECAR_PEER
from ..plan import Plan
from .base import Contract, _docs, _guard_configs, _vllm_deployments

ISTIO = "1.24.6 / 1.30.3"


def istio_peer_and_claim_header(plan: Plan) -> list[str]:
    out = []
    written = [(rule.get("claim"), rule.get("header"), jwt.get("issuer")) for ra in _docs(plan, "RequestAuthentication")
               for jwt in ra["spec"].get("jwtRules") or [] for rule in jwt.get("outputClaimToHeaders") or []]
    headers = {h for claim, h, _ in written if claim == "iss"}
    for name, cfg in _guard_configs(plan):
        # A P/D decode pod's guard trusts its routing sidecar instead (contracts/disaggregation_cluster.py).
        if cfg.get("trustedPeers") != [SIDECAR_PEER] and cfg.get("kvTransfer") != "routing-sidecar":
            out.append(f"{name}: the guard trusts {cfg.get('trustedPeers')}, not the sidecar's {SIDECAR_PEER}")
        if cfg.get("issuerHeader") not in headers:
            out.append(f"{name}: no RequestAuthentication writes the issuer into {cfg.get('issuerHeader')}")
        for iss, entry in (cfg.get("issuers") or {}).items():
            if "subjects" in entry and ("sub", cfg.get("subjectHeader"), iss) not in written:
                out.append(f"{name}: no RequestAuthentication of '{iss}' writes the subject into "
                           f"{cfg.get('subjectHeader')}, so its listed subjects could never pass the guard")
    for d in _vllm_deployments(plan):
        if (d["spec"]["template"]["metadata"].get("labels") or {}).get("sidecar.istio.io/inject") == "false":
            out.append(f"{d['metadata']['name']}: no sidecar, so no JWT check and no 127.0.0.6 peer")
    return out


def istio_sidecar_outlives_vllm(plan: Plan) -> list[str]:
    out = []
    for d in _vllm_deployments(plan):
        ann = d["spec"]["template"]["metadata"].get("annotations") or {}
        proxy = json.loads(ann.get("proxy.istio.io/config") or "{}")
        if ann.get("sidecar.istio.io/nativeSidecar") != "true" or \
                (proxy.get("proxyMetadata") or {}).get("EXIT_ON_ZERO_ACTIVE_CONNECTIONS") != "true":
            out.append(f"{d['metadata']['name']}: the sidecar may exit before vLLM has finished what it accepted")
    return out


def _principal(value: str) -> tuple[str, str]:
    """(iss, sub) as Istio reads a requestPrincipals value: split at its last '/'."""
    iss, _, sub = value.rpartition("/")
    return iss, sub


def istio_principals_are_the_tenants(plan: Plan) -> list[str]:
    """Each tenant's ALLOW rules name its verbatim issuer with its listed subjects exactly (any
    subject only where it lists none), as Istio splits and matches them."""
    out = []
    for t in plan.config.tenants:
        wanted = {(t.jwt.issuer, s) for s in t.jwt.subjects} if t.jwt.subjects is not None else {(t.jwt.issuer, "*")}
        mine = [d for d in _docs(plan, "AuthorizationPolicy") + _docs(plan, "RequestAuthentication")
                if (d["metadata"].get("labels") or {}).get(TENANT_LABEL) == t.name]
        for d in mine:
            where = f"{d['metadata']['namespace']}/{d['metadata']['name']}"
            for jwt in d["spec"].get("jwtRules") or []:
                if jwt.get("issuer") != t.jwt.issuer:
                    out.append(f"{where}: issuer '{jwt.get('issuer')}' is not the tokens' '{t.jwt.issuer}' verbatim")
            for rule in d["spec"].get("rules") or []:
                for src in rule.get("from") or []:
                    got = {_principal(v) for v in (src.get("source") or {}).get("requestPrincipals") or []}
                    if got != wanted or any(sub != "*" and (sub.startswith("*") or sub.endswith("*"))
                                            for _, sub in got):
                        out.append(f"{where}: requestPrincipals admit {sorted(got)}, not tenant '{t.name}'s "
                                   f"{sorted(wanted)}")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Istio sidecar", ISTIO,
             "inbound traffic reaches the app from the passthrough address 127.0.0.6 (mesh inboundTrafficPolicy "
             "PASSTHROUGH, the default, with REDIRECT capture; LOCALHOST mode would deliver from 127.0.0.1, TPROXY "
             "from the client: both refused); outputClaimToHeaders writes the verified claim and strips a client's "
             "copy of that header",
             "istio/istio@1.24.6:pilot/pkg/networking/core/listener_address.go:35-37 (the address), "
             "pkg/config/mesh/mesh.go:84 and pilot/pkg/networking/core/cluster.go:512-515 (PASSTHROUGH by default), "
             "pilot/pkg/networking/core/cluster_builder.go:441-451 (1.30.3: 671-681, the inbound cluster's source); "
             "pilot/pkg/security/authn/policy_applier.go:174-179 (1.30.3: 175-180, claim_to_headers; the strip of a "
             "client's copy is Envoy's jwt_authn, istio/istio#53212)",
             "the guard trusts only 127.0.0.6 and reads the issuer header the RequestAuthentications write (and, for "
             "a tenant listing jwt.subjects, the subject header written from sub); each ALLOW rule also requires those "
             "headers to be its token's issuer and a listed subject, so a data plane leaving a client's copy in place "
             "cannot pass one tenant as another; every vLLM pod is meshed", istio_peer_and_claim_header),
    Contract("Istio sidecar", ISTIO,
             "sidecar.istio.io/nativeSidecar makes istio-proxy an init container that drains from its preStop and "
             "stops after the app; a classic sidecar exits 5 s after SIGTERM (terminationDrainDuration) unless "
             "EXIT_ON_ZERO_ACTIVE_CONNECTIONS (proxyMetadata) makes it wait for its last connection",
             "istio/api@1.24.6:annotation/annotations.yaml:251 (1.30.3: 273); istio/istio@1.24.6,1.30.3:"
             "pkg/envoy/agent.go:140-230; pkg/config/mesh/mesh.go:45",
             "vLLM pods carry both, so the sidecar serves until vLLM has drained", istio_sidecar_outlives_vllm),
    Contract("Istio authorization", ISTIO,
             "a requestPrincipals value is split at its last '/' into iss and sub, each matched exactly against the "
             "verified token's claims (a '*' at the value's start or end makes a suffix or prefix match; `iss/*` "
             "is any subject of that exact issuer); the RequestAuthentication issuer reaches Envoy's jwt_authn "
             "verbatim",
             "istio/istio@1.24.6:pilot/pkg/security/authz/model/generator.go:202-251 (1.30.3: 263-312); "
             "pilot/pkg/security/authn/policy_applier.go:163 (1.30.3: 164)",
             "a tenant's ALLOW rules name `<iss>/<sub>` per listed subject (jwt.subjects: no '/', no '*' at an "
             "end, so each matches exactly), `<iss>/*` only where it lists none (refused for a shared public "
             "issuer), with the issuer verbatim (a trailing '/' kept) in both resources and the guard's config",
             istio_principals_are_the_tenants),
)
