"""Prefill/decode disaggregation, the cluster side (models[].disaggregation): the role each pool's pods
take, llm-d-router's routing sidecar on the decode pods, the picker's P/D scheduling, and the only
paths the prefill pods are open to. The model side (vLLM's flags and environment, the transport, the
sizing) is components/model/disaggregation.py's; components/prefill_pool.py declares the prefill pool.

Upstream file:line are llm-d/llm-d-router at v0.10.0 unless named otherwise; infra/contracts/
disaggregation_cluster.py checks the plan against each.

How a request runs: the Gateway's identity extension refuses any body carrying `kv_transfer_params`
and strips every routing header a client sends (serving_api.IDENTITY_STRIPS); the picker's
disagg-profile-handler picks a decode pod (decode-filter) and, where the prefix-based-pd-decider finds
enough uncached prompt tokens, a prefill pod (prefill-filter), naming it in x-prefiller-host-port; the
decode pod's routing sidecar (on the pool's port, vLLM behind it on DECODE_ENGINE_PORT) sends the prompt
to that pod with max_tokens 1 and kv_transfer_params of its own (pkg/sidecar/proxy/connector_nixlv2.go:
161-170: whatever the client sent is overwritten), then hands the prefill's answer to its own vLLM, which
reads the blocks over NIXL. The tenant's token travels with both legs, so the mesh and the guard check the
tenant on the prefill pod as on the decode pod.

Who may send kv_transfer_params to vLLM (the guard's `kvTransfer`, images/vllm_gke_guard/kv_transfer.py):
nobody on a plain pool; on a prefill pod only the sidecar's own prefill leg (remote fields all null);
on a decode pod whatever the routing sidecar forwards (its own decode leg, or a body the extension
already refused any copy in), and only the sidecar: the guard trusts 127.0.0.1 there, not Envoy's
127.0.0.6, so a request reaching vLLM's port past the sidecar is refused."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from .capacity import rollout_strategy
from .disaggregation import NIXL_SIDE_CHANNEL_PORT, ROLE_LABEL, SIDECAR_KV_CONNECTOR, Role, prefill_pool, role_of
from .fallback import shared_callers
from .k8s_objects import CONTAINER_SECURITY, MODEL_LABEL
from .picker import EPP_VERSION, gmp_collectors, picker_labels, picker_name
from .rollouts import RolloutPlan
from .serving_api import SIDECAR_ROUTING_HEADERS
from .specs import ImageRef, ModelSpec, NodePoolSpec, ServingPoolSpec, TenantSpec
from .vllm_server import GUARD_CONFIG_ENV, PORT
from .vllm_versions import VllmRelease

if TYPE_CHECKING:
    from .serving_plan import PoolService
    from .stack_config import StackConfig

# The routing sidecar: Dockerfile.sidecar builds cmd/pd-sidecar as /app/pd-sidecar (:39-49), the
# release tags it as it tags the picker (Makefile:22,26,32: ghcr.io/llm-d/llm-d-router-disagg-sidecar);
# no digest is published in the repository, so the release's tag it is, as for the picker.
SIDECAR_IMAGE = ImageRef(repository="ghcr.io/llm-d/llm-d-router-disagg-sidecar", tag=EPP_VERSION)
SIDECAR_UID = 65532  # Dockerfile.sidecar:47 (USER 65532:65532)
# vLLM behind the sidecar on a decode pod: the sidecar's default model-server port
# (pkg/sidecar/proxy/options.go:92, defaultVLLMPort).
DECODE_ENGINE_PORT = 8200
# The routing sidecar's own port, behind the P/D front (which takes the pool's port): the sidecar routes
# exact unprefixed paths only (proxy.go:627-635), the front takes the tenant URL's prefix off first.
SIDECAR_PORT = 8100
# The P/D front (the server image's images/vllm_gke_guard/pd_front.py): the prefix off, client
# kv_transfer_params refused, everything else passed to the sidecar as it came.
PD_FRONT_MODULE, PD_FRONT_NAME = "vllm_gke_guard.pd_front", "pd-front"
# The header naming the prefill pod (pkg/common/routing/common.go:14), and the other routing headers
# the sidecar acts on (:17,20,25): a client's copy would send its prompt (or a pull) anywhere, so the
# identity extension strips them all (serving_api.IDENTITY_STRIPS).
(PREFILL_HEADER, *_) = ROUTING_HEADERS = SIDECAR_ROUTING_HEADERS
# The ports UCX's TCP transport listens on (UCX_TCP_PORT_RANGE; its default, 0, is any ephemeral port,
# which no NetworkPolicy could name): one a NIXL agent's interface (an agent a tensor-parallel rank, 8 a
# pod at most), each drawn at random in the range and drawn again while taken: four times that. UCX keeps
# only the part of the range inside the kernel's ip_local_port_range (Linux's default 32768-60999; none
# of it: the interface fails to open), openucx/ucx src/uct/tcp/tcp_iface.c (PORT_RANGE,
# uct_tcp_iface_set_port_range, uct_tcp_iface_server_init): so a range inside it.
UCX_PORTS = tuple(range(40000, 40032))
# The guard's peers: Envoy's inbound passthrough, and on a decode pod the routing sidecar over loopback.
ENVOY_PEER, SIDECAR_PEER = "127.0.0.6", "127.0.0.1"
# What the guard lets through of kv_transfer_params, per role (default: refuse).
GUARD_KV_TRANSFER: dict[Role, str] = {"prefill": "prefill-leg", "decode": "routing-sidecar"}

# The picker's P/D plugins (registered Beta, cmd/epp/runner/runner.go:577,578,620,622).
PREFILL_FILTER, DECODE_FILTER = "prefill-filter", "decode-filter"  # filter/bylabel/roles.go:33-35
DECIDER = "prefix-based-pd-decider"  # profilehandler/disagg/prefix_based_pd_decider.go:19
HANDLER = "disagg-profile-handler"  # profilehandler/disagg/disagg_profile_handler.go:32
PROFILES: dict[Role, str] = {"prefill": "prefill", "decode": "decode"}  # the handler's defaults (:34-35)
ROLE_FILTERS: tuple[tuple[Role, str], ...] = (("prefill", PREFILL_FILTER), ("decode", DECODE_FILTER))


def pod_role(model: ModelSpec, pool: ServingPoolSpec) -> Optional[Role]:
    """The pool's role where the model is disaggregated (its short pool decodes), else None."""
    return role_of(pool) if model.disaggregation is not None else None


def prefill_service(decode: "PoolService", node_pool: NodePoolSpec, image: ImageRef, release: VllmRelease,
                    load_seconds: float) -> "PoolService":
    """The prefill pool as a serving pool of the model beside its decode (short) pool: the same callers and
    guard (its role's view of it is set on the pod), its own node pool, workload (<model>-prefill), scaling
    and budget. Rolled in place from one replica: while none is ready the picker's prefill profile finds no
    pod and the decode pods prefill locally, where a surge replica could wait for a GPU node for ever."""
    model = decode.model
    return dataclasses.replace(
        decode, key=decode.key.removesuffix("-short") + "-prefill", which="prefill", pool=prefill_pool(model),
        node_pool=node_pool, kv_peer=decode.node_pool, image=image, release=release, load_seconds=load_seconds,
        rolling=rollout_strategy(1), wait_behind_seconds=0.0, standby_name="", picker_pool="",
        rollout=RolloutPlan("in-place", "the prefill pool: the decode pods prefill while it rolls",
                            primary_max=model.disaggregation.prefill.max_replicas if model.disaggregation else 1))


def routing_sidecar(image: str = SIDECAR_IMAGE.uri) -> dict[str, Any]:
    """llm-d-router's routing sidecar as a native sidecar (an init container with restartPolicy Always, as
    upstream's decode Deployment runs it, deploy/components/vllm-decode/deployment.yaml): up before vLLM,
    stopped after it. It listens on SIDECAR_PORT behind the P/D front (pd_front) and proxies to vLLM on
    DECODE_ENGINE_PORT. Plain HTTP (--secure-proxy=false, default true, options.go:218,278): its
    self-signed certificate would fail the load balancer and the picker. Nor does the mesh encrypt its prefill
    leg: that names a pod IP, which matches no Service's virtual host, and goes out in plain text
    (prefill_service_spec).
    No SSRF allowlist (--enable-ssrf-protection needs the API to watch the InferencePool, options.go:668-672):
    the server pods hold no API token; the identity extension strips every client copy of the routing
    headers instead, and the prefill pods admit the model's decode pods alone."""
    return {
        "name": "routing-sidecar", "image": image, "restartPolicy": "Always",
        "args": [f"--port={SIDECAR_PORT}", f"--model-server-port={DECODE_ENGINE_PORT}",
                 f"--kv-connector={SIDECAR_KV_CONNECTOR}", "--secure-proxy=false", "--zap-encoder=json"],
        "ports": [{"name": "routing", "containerPort": SIDECAR_PORT}],
        # The proxy's own /health (proxy.go:624-626), which answers while it listens.
        "readinessProbe": {"httpGet": {"path": "/health", "port": SIDECAR_PORT}, "periodSeconds": 5},
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        "securityContext": {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": SIDECAR_UID,
                            "runAsGroup": SIDECAR_UID},
    }


def pd_front(image: str, guard_env: Mapping[str, Any]) -> dict[str, Any]:
    """The P/D front as a native sidecar on the pool's port (the InferencePool's targetPort, the load
    balancer's health check), in front of the routing sidecar: it takes the pool's prefixes off as the
    guard does (the guard's config, `guard_env`, names them) and refuses client kv_transfer_params. The
    server image, run as the vLLM container runs (non-root, read-only root)."""
    return {
        "name": PD_FRONT_NAME, "image": image, "restartPolicy": "Always",
        "command": ["python3", "-m", PD_FRONT_MODULE, f"--port={PORT}", f"--upstream-port={SIDECAR_PORT}"],
        # The InferencePool's targetPort, by number (picker.pool_spec).
        "ports": [{"name": "pd-front", "containerPort": PORT}],
        # The sidecar's /health through the front: ready once both listen.
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 5},
        "env": [dict(guard_env)],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        "securityContext": {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": SIDECAR_UID,
                            "runAsGroup": SIDECAR_UID},
    }


def role_guard_config(guard: Mapping[str, Any], role: Role) -> dict[str, Any]:
    """The guard's config on a pod of the role: what kv_transfer_params it passes, and from whom. A prefill
    pod's guard checks the tenant and takes its limits, before the prefill's GPU work, but counts no usage
    (`unmetered`: the decode pod's guard counts it, and takes no limit for the sidecar's decode leg, so a
    request counts once in the shared limit, store.py, and in the usage report, which sums every pod); the
    tenant's max-tokens cap is checked by the P/D front before the sidecar (the prefill leg's max_tokens is
    1); no fallback model (the leg is the sidecar's, not the tenant's)."""
    out = {**guard, "kvTransfer": GUARD_KV_TRANSFER[role]}
    if role == "decode":
        out["trustedPeers"] = [SIDECAR_PEER]
    else:
        out["unmetered"] = True
        out.pop("fallback", None)
    return out


def _ports(ports: tuple[int, ...]) -> str:
    return ",".join(str(p) for p in ports)


def disaggregated_pod(template: dict[str, Any], role: Role, nixl_env: Sequence[Mapping[str, Any]] = (),
                      worker: bool = False) -> dict[str, Any]:
    """A serving pod's template in its P/D role: the role label the picker's filters read (bylabel/roles.go:
    11-16), UCX on the listed ports, the NIXL ports past the mesh (the blocks would otherwise cross two
    Envoys; the prefill pods' NetworkPolicy fences them), and on a decode pod the routing sidecar in front
    of vLLM. `nixl_env`: what NIXL reads (disaggregation.kv_transfer_env). A group's worker takes the
    label alone (it serves nothing)."""
    out = copy.deepcopy(template)
    out["metadata"]["labels"][ROLE_LABEL] = role
    if worker:
        return out
    spec, notes = out["spec"], out["metadata"]["annotations"]
    (vllm,) = [c for c in spec["containers"] if c["name"] == "vllm"]
    vllm["env"] = [*(_role_env(e, role) for e in vllm["env"]), *(dict(e) for e in nixl_env),
                   {"name": "UCX_TCP_PORT_RANGE", "value": f"{UCX_PORTS[0]}-{UCX_PORTS[-1]}"}]
    if role == "prefill":
        notes["traffic.sidecar.istio.io/excludeInboundPorts"] = _ports((NIXL_SIDE_CHANNEL_PORT, *UCX_PORTS))
        vllm["ports"] = [*vllm["ports"], {"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT}]
        return out
    notes["traffic.sidecar.istio.io/excludeOutboundPorts"] = _ports((NIXL_SIDE_CHANNEL_PORT, *UCX_PORTS))
    # vLLM keeps the port name its probes, its Service and its scrape read (they reach it past the
    # sidecar: /health and /metrics are open, and a tenant request from Envoy's peer is refused there).
    vllm["args"] = _engine_port(vllm["args"])
    vllm["ports"] = [{"name": "http", "containerPort": DECODE_ENGINE_PORT}]
    guard_env = next(e for e in vllm["env"] if e.get("name") == GUARD_CONFIG_ENV)
    spec["initContainers"] = [*spec.get("initContainers", []), routing_sidecar(), pd_front(vllm["image"], guard_env)]
    return out


def _role_env(entry: dict[str, Any], role: Role) -> dict[str, Any]:
    if entry.get("name") != GUARD_CONFIG_ENV:
        return entry
    return {**entry, "value": json.dumps(role_guard_config(json.loads(entry["value"]), role), sort_keys=True)}


def _engine_port(args: list[str]) -> list[str]:
    """vLLM's --port moved behind the sidecar."""
    out = list(args)
    i = out.index("--port")
    out[i + 1] = str(DECODE_ENGINE_PORT)
    return out


def pd_picker_config(config: Mapping[str, Any], min_prompt_tokens: int) -> dict[str, Any]:
    """The picker's config with P/D scheduling, as deploy/config/pd-epp-config.yaml lays it out: the role
    filters, the decider (nonCachedTokens: prompts with fewer uncached tokens on the chosen decode pod are
    prefilled there, prefix_based_pd_decider.go:105-160; 0 would turn P/D off) and the handler, and the one
    default profile split into a prefill and a decode profile, each its filter then the same scorers."""
    out = copy.deepcopy(dict(config))
    (default,) = out["schedulingProfiles"]
    out["plugins"] = [*out["plugins"], {"type": PREFILL_FILTER}, {"type": DECODE_FILTER},
                      {"type": DECIDER, "parameters": {"nonCachedTokens": min_prompt_tokens}},
                      {"type": HANDLER, "parameters": {"profiles": dict(PROFILES), "deciders": {"prefill": DECIDER}}}]
    out["schedulingProfiles"] = [
        {"name": PROFILES[role], "plugins": [{"pluginRef": f}, *copy.deepcopy(default["plugins"])]}
        for role, f in ROLE_FILTERS]
    return out


def role_selector(model: str, role: Role) -> dict[str, str]:
    return {MODEL_LABEL: model, ROLE_LABEL: role}


def prefill_ingress(model: str) -> dict[str, Any]:
    """The prefill pods' NetworkPolicy: the model's decode pods alone to vLLM's port (the routing sidecar's
    prefill leg), the side channel and UCX's ports; the model's picker and Managed Prometheus to vLLM's port
    (its /metrics: the picker scores the pods by it; the mesh admits nothing else from them)."""
    decode = [{"podSelector": {"matchLabels": role_selector(model, "decode")}}]
    tcp = [{"protocol": "TCP", "port": p} for p in (PORT, NIXL_SIDE_CHANNEL_PORT)]
    ucx = [{"protocol": "TCP", "port": UCX_PORTS[0], "endPort": UCX_PORTS[-1]}]
    scrapers = [{"podSelector": {"matchLabels": picker_labels(picker_name(model))}}, *gmp_collectors()]
    return {"podSelector": {"matchLabels": role_selector(model, "prefill")}, "policyTypes": ["Ingress"],
            "ingress": [{"from": decode, "ports": [*tcp, *ucx]},
                        {"from": scrapers, "ports": [{"protocol": "TCP", "port": PORT}]}]}


def decode_ingress(model: str, load_balancer_sources: Sequence[object], metrics_sources: Sequence[str]) -> dict[str, Any]:
    """The decode pods' NetworkPolicy: the pool's port (the P/D front) for the load balancer's proxies and
    health checks (as the picker's, picker.picker_ingress) and the model's picker (it scrapes /metrics
    there); vLLM's own port (its /metrics, PodMonitoring) for Managed Prometheus; NIXL's side channel and
    UCX's ports for the model's prefill pods alone (the pull connector's peer, a connect-back included).
    No other pod reaches a decode pod: a caller past the load balancer would skip the identity extension."""
    lb = [{"ipBlock": {"cidr": c}} for c in load_balancer_sources]
    picker = [{"podSelector": {"matchLabels": picker_labels(picker_name(model))}}]
    scrapers = [*gmp_collectors(), *({"ipBlock": {"cidr": c}} for c in metrics_sources)]
    prefill = [{"podSelector": {"matchLabels": role_selector(model, "prefill")}}]
    return {"podSelector": {"matchLabels": role_selector(model, "decode")}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [*lb, *picker], "ports": [{"protocol": "TCP", "port": PORT}]},
                        {"from": scrapers, "ports": [{"protocol": "TCP", "port": DECODE_ENGINE_PORT}]},
                        {"from": prefill, "ports": [{"protocol": "TCP", "port": NIXL_SIDE_CHANNEL_PORT},
                                                    {"protocol": "TCP", "port": UCX_PORTS[0], "endPort": UCX_PORTS[-1]}]}]}


def prefill_mesh_policy(model: str, server_principal: str, pods_cidr: str) -> dict[str, Any]:
    """An AuthorizationPolicy on the prefill pods refusing every request from neither a server pod's mTLS
    identity nor a pod address (the load balancer's proxies, anything outside the cluster) but the scrape
    of /metrics and /health: the decode pod's sidecar reaches a pod IP, which the mesh carries in plain
    text (no principal: prefill_service_spec), from its own pod's address. The NetworkPolicy narrows the pods to the model's
    decode pods; the tenants' own ALLOW policies still apply on top: the tenant's token travels with the
    prefill leg."""
    return {"selector": {"matchLabels": role_selector(model, "prefill")}, "action": "DENY",
            "rules": [{"from": [{"source": {"notPrincipals": [server_principal], "notIpBlocks": [pods_cidr]}}],
                       "to": [{"operation": {"notPaths": ["/metrics", "/health"]}}]}]}


def prefill_service_spec(model: str) -> dict[str, Any]:
    """A headless Service over the prefill pods: the mesh knows their port as HTTP. It does not encrypt the
    prefill leg: the routing sidecar sends it to the pod IP the picker named, keeping the request's Host, and
    Istio matches a virtual host by a Service's names alone (istio 1.30.3 pilot/pkg/networking/core/
    httproute.go:565-588; a headless Service has no address), so the decode pod's Envoy passes it through,
    plain text and no principal (PassthroughCluster, :782-809): the tenant's token and prompt cross the node
    network unencrypted inside the VPC, as NIXL's blocks do (the plan says so)."""
    return {"clusterIP": "None", "selector": role_selector(model, "prefill"),
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT, "appProtocol": "http"}]}


def forwards_token(cfg: "StackConfig", tenant: TenantSpec) -> bool:
    """Whether the tenant's bearer token must stay on its requests to the shared servers: a disaggregated
    model it calls sends them on to a prefill pod, whose mesh and guard check the tenant again."""
    return any(m.disaggregation is not None and tenant in shared_callers(cfg, m) for m in cfg.models)
