"""Every value GCP, Kubernetes or vLLM would reject later is stopped at plan time: the key is
named, the fix given, the CLI exits 2 without a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any, Callable

import pytest

from tests.conftest import REPO_ROOT, by_hand
from vllm_gke.components.model.gcp_names import is_service_account_id, service_account_id
from vllm_gke.infra.config import ConfigError, parse


def problems(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(values)
    return [str(i) for i in exc.value.issues]


def set_path(values: dict[str, Any], key: str, path: tuple, value: Any) -> None:
    node = values[key]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def tenant(values, i=0):
    return values["vllm-gke:tenants"][i]


def _model_named_like_a_dedicated_copy(values: dict) -> None:
    copy = dict(next(m for m in values["vllm-gke:models"] if m["name"] == "qwen-7b"))
    values["vllm-gke:models"].append({**copy, "name": "analytics-qwen-7b"})


CASES: list[tuple[str, str, Callable[[dict], None], str, str]] = [
    # (id, stack, mutate, key the message starts with, words it contains)
    ("model-named-like-a-dedicated-copy", "prod", _model_named_like_a_dedicated_copy,
     "vllm-gke:tenants[analytics].dedicated.models", "named 'analytics-qwen-7b', which is also a model's name"),
    ("model-named-like-a-canary", "prod",
     lambda v: by_hand(v) or v["vllm-gke:models"].append({**next(m for m in v["vllm-gke:models"] if m["name"] == "qwen-7b"),
                                            "name": "llama-8b-canary"}),
     "vllm-gke:models[llama-8b].canary", "named 'llama-8b-canary', which is also a model's name"),
    ("node-pool-named-like-a-twin", "dev",
     lambda v: v["vllm-gke:nodePools"].append({"name": "a100-mig-ondemand", "machineType": "a2-highgpu-1g"}),
     "vllm-gke:nodePools[a100-mig].onDemandFallback", "on-demand twin is the node pool 'a100-mig-ondemand'"),
    # The placement is the tenant's; the message names the model's key that does not fit it.
    ("dedicated-copy-tensor-parallel", "prod",
     lambda v: next(m for m in v["vllm-gke:models"] if m["name"] == "qwen-7b").update(tensorParallelSize=2),
     "vllm-gke:tenants[analytics].dedicated.nodePool",
     "models[qwen-7b]: tensorParallelSize x pipelineParallelSize is 2 x 1 = 2 but pool 'a100-mig'"),
    ("cidr-unparsable", "dev", lambda v: v["vllm-gke:cluster"].update(podsCidr="10.20.0.0/33"),
     "vllm-gke:cluster.podsCidr", "not an IPv4 range like 10.0.0.0/14"),
    ("cidr-junk", "dev", lambda v: v["vllm-gke:cluster"].update(podsCidr="banana"),
     "vllm-gke:cluster.podsCidr", "'banana' is not an IPv4 range"),
    # The fix offered is one the check then accepts.
    ("cidr-host-bits", "dev", lambda v: v["vllm-gke:cluster"].update(subnetCidr="10.10.0.1/20"),
     "vllm-gke:cluster.subnetCidr", "bits past its prefix; the range is 10.10.0.0/20"),
    ("cidr-master-without-prefix", "dev", lambda v: v["vllm-gke:cluster"].update(masterCidr="172.16.0.0"),
     "vllm-gke:cluster.masterCidr", "like 172.16.0.0/28"),
    ("cidr-subnet-without-prefix", "dev", lambda v: v["vllm-gke:cluster"].update(subnetCidr="10.10.0.0"),
     "vllm-gke:cluster.subnetCidr", "like 10.10.0.0/20"),
    ("cidr-pods-too-small", "dev", lambda v: v["vllm-gke:cluster"].update(podsCidr="10.20.0.0/30"),
     "vllm-gke:cluster.podsCidr", "too small: a /21 at least"),
    ("cidr-ipv6", "dev", lambda v: v["vllm-gke:cluster"].update(podsCidr="fd00::/64"),
     "vllm-gke:cluster.podsCidr", "is IPv6"),
    ("cidr-overlap", "dev", lambda v: v["vllm-gke:cluster"].update(servicesCidr="10.20.4.0/22"),
     "vllm-gke:cluster.servicesCidr", "overlaps cluster.podsCidr"),
    # The stack set subnetCidr only: the overlap is named by it, the default it met said to be one.
    ("cidr-overlap-proxy-only", "dev", lambda v: v["vllm-gke:cluster"].update(subnetCidr="10.128.0.0/14"),
     "vllm-gke:cluster.subnetCidr", "overlaps cluster.proxyOnlyCidr 10.129.0.0/23 (its default)"),
    ("adapter-tenant-not-declared", "prod",
     lambda v: next(m for m in v["vllm-gke:models"] if m.get("adapters"))["adapters"][0].update(tenants=["suport"]),
     "vllm-gke:models[llama-8b].adapters[support-sql].tenants",
     "tenant 'suport' is not declared; use one of analytics, search, support"),
    ("cidr-without-prefix", "dev", lambda v: v["vllm-gke:cluster"].update(podsCidr="10.20.0.0"),
     "vllm-gke:cluster.podsCidr", "has no prefix length"),
    # The bucket backend's file cache is on the node's boot disk: a node full of replicas must fit.
    ("boot-disk-too-small-for-the-file-cache", "staging",
     lambda v: v["vllm-gke:nodePools"][0].update(diskSizeGb=100),
     "vllm-gke:nodePools[a100-80-mig].diskSizeGb", "raise diskSizeGb to"),
    ("zone-that-does-not-exist", "dev", lambda v: v["vllm-gke:cluster"].update(zones=["us-central1-e"]),
     "vllm-gke:cluster.zones", "does not exist; us-central1 has us-central1-a"),
    # Issue 35: a misspelt region got a zone suggestion of its own misspelling; now the region is named.
    ("region-misspelt", "dev", lambda v: v.update({"gcp:region": "europe-west-4"}),
     "gcp:region", "'europe-west-4' is not a Compute Engine region; did you mean europe-west4?"),
    ("region-that-does-not-exist", "dev", lambda v: v.update({"gcp:region": "us-central9"}),
     "gcp:region", "did you mean us-central1?"),
    ("region-unlike-any", "dev", lambda v: v.update({"gcp:region": "mars-north1"}),
     "gcp:region", "use one of us-central1, us-east1"),
    # A zone the catalog's region lacks is named with the ones it has (europe-west1 has no -a).
    ("zone-that-does-not-exist-in-a-region-without-a", "dev",
     lambda v: (v.update({"gcp:region": "europe-west1"}), v["vllm-gke:cluster"].update(zones=["europe-west1-a"])),
     "vllm-gke:cluster.zones", "europe-west1 has europe-west1-b, europe-west1-c, europe-west1-d"),
    ("control-plane-not-28", "dev", lambda v: v["vllm-gke:cluster"].update(masterCidr="172.16.0.0/27"),
     "vllm-gke:cluster.masterCidr", "must be a /28"),
    ("zone-outside-region", "dev", lambda v: v["vllm-gke:cluster"].update(zones=["europe-west4-a"]),
     "vllm-gke:cluster.zones", "not in region us-central1"),
    ("zone-is-a-region", "dev", lambda v: v["vllm-gke:cluster"].update(zones=["us-central1"]),
     "vllm-gke:cluster.zones", "that is a region"),
    ("duplicate-zones", "staging", lambda v: v["vllm-gke:cluster"].update(zones=["us-central1-a"] * 2),
     "vllm-gke:cluster.zones", "more than once"),
    ("hostname", "prod", lambda v: v["vllm-gke:gateway"].update(hostname="llm_acme.example"),
     "vllm-gke:gateway.hostname", "not a DNS hostname"),
    ("hostname-uppercase", "prod", lambda v: v["vllm-gke:gateway"].update(hostname="LLM.acme.example"),
     "vllm-gke:gateway.hostname", "not a DNS hostname"),
    ("tls-secret-name", "prod", lambda v: v["vllm-gke:gateway"].update(tlsSecretName="My_Cert"),
     "vllm-gke:gateway.tlsSecretName", "not a Kubernetes object name"),
    ("notification-email", "dev", lambda v: v["vllm-gke:monitoring"].update(notificationEmails=["oncall"]),
     "vllm-gke:monitoring.notificationEmails[0]", "not an e-mail address"),
    ("shared-issuer", "prod", lambda v: tenant(v, 1)["jwt"].update(issuer=tenant(v, 0)["jwt"]["issuer"]),
     "vllm-gke:tenants[support].jwt.issuer", "each needs its own"),
    ("empty-audiences", "dev", lambda v: tenant(v)["jwt"].update(audiences=[]),
     "vllm-gke:tenants[dev-team].jwt.audiences", "at least 1"),
    ("issuer-not-https", "dev", lambda v: tenant(v)["jwt"].update(issuer="http://accounts.google.com"),
     "vllm-gke:tenants[dev-team].jwt.issuer", "https://"),
    ("max-tokens-over-model", "dev", lambda v: tenant(v).update(maxTokens=9000),
     "vllm-gke:tenants[dev-team].maxTokens", "exceeds what model 'qwen-7b' serves, maxModelLen 8192"),
    ("model-listed-twice", "dev", lambda v: tenant(v).update(models=["qwen-7b", "qwen-7b"]),
     "vllm-gke:tenants[dev-team].models", "more than once"),
    ("chunked-prefill-off", "dev", lambda v: v["vllm-gke:models"][0].update(enableChunkedPrefill=False),
     "vllm-gke:models[qwen-7b].long.maxNumBatchedTokens", "below the pool's maxModelLen 8192"),
    ("serving-namespace-is-a-tenants", "dev", lambda v: v.update({"vllm-gke:servingNamespace": "tenant-dev-team"}),
     "vllm-gke:servingNamespace", "a tenant's namespace"),
    ("serving-namespace-reserved", "dev", lambda v: v.update({"vllm-gke:servingNamespace": "istio-system"}),
     "vllm-gke:servingNamespace", "owns"),
    ("spot-pool-name-too-long", "dev",
     lambda v: (v["vllm-gke:nodePools"][0].update(name="a" * 32), v["vllm-gke:models"][0].update(nodePool="a" * 32)),
     f"vllm-gke:nodePools[{'a' * 32}]", "exceeds GKE's 40 characters"),
    ("extra-arg-managed", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--max_num_seqs=4"]),
     "vllm-gke:models[qwen-7b].extraArgs", "may not set --max-num-seqs"),
    ("extra-arg-managed-short-alias", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["-tp", "2"]),
     "vllm-gke:models[qwen-7b].extraArgs", "may not set -tp"),
    # A goal whose budget cannot burn as fast as the page's rate: the alert could never fire.
    ("slo-alert-unreachable", "dev", lambda v: v.setdefault("vllm-gke:monitoring", {}).update(slos={"ttft": 0.9}),
     "vllm-gke:monitoring.slos.ttft", "at most 10 times as fast as it can afford, under the fast burn alert's 13.44"),
    ("traces-without-opentelemetry", "dev", lambda v: (v.update({"vllm-gke:vllmVersion": "0.11.0"}),
                                                        v.setdefault("vllm-gke:monitoring", {}).update(
                                                            traces={"enabled": True})),
     "vllm-gke:monitoring.traces.enabled", "does not ship OpenTelemetry"),
    # The guard reads the engine's queue and the usage in its API server's process.
    ("extra-arg-api-servers", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["-asc", "2"]),
     "vllm-gke:models[qwen-7b].extraArgs", "may not set -asc"),
    ("extra-arg-data-parallel", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--data-parallel-size=2"]),
     "vllm-gke:models[qwen-7b].extraArgs", "with several, vLLM starts several API servers"),
    ("extra-arg-no-stats", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--disable-log-stats"]),
     "vllm-gke:models[qwen-7b].extraArgs", "overload check reads vLLM's stats"),
    # The TTFT SLO's cut is a bucket bound the servers add: extraArgs may not replace the buckets.
    ("extra-arg-histogram-buckets", "prod", lambda v: v["vllm-gke:models"][0].update(
        extraArgs=['--custom-histogram-buckets={"time_to_first_token":[1]}']),
     "vllm-gke:models[llama-70b].extraArgs", "set monitoring.ttftSloSeconds"),
    ("extra-arg-secret", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--hf-token=abc"]),
     "vllm-gke:models[qwen-7b].extraArgs", "a secret on the command line"),
    ("extra-arg-middleware", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--middleware", "x.Y"]),
     "vllm-gke:models[qwen-7b].extraArgs", "tenant guard"),
    ("extra-arg-unknown", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--enforce-eagr"]),
     "vllm-gke:models[qwen-7b].extraArgs", "not an option of vLLM 0.34.0"),
    ("extra-arg-bad-choice", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--dtype-x"]),
     "vllm-gke:models[qwen-7b].extraArgs", "not an option"),
    ("revision-traversal", "dev", lambda v: v["vllm-gke:models"][0].update(revision="../../etc"),
     "vllm-gke:models[qwen-7b].revision", "not a git branch, tag or commit"),
    ("revision-shell", "dev", lambda v: v["vllm-gke:models"][0].update(revision="main; rm -rf /"),
     "vllm-gke:models[qwen-7b].revision", "not a git branch"),
    ("source-traversal", "dev", lambda v: v["vllm-gke:models"][0].update(source="gs://bucket/../other"),
     "vllm-gke:models[qwen-7b].source", "no '..' segments"),
    ("source-unicode", "dev", lambda v: v["vllm-gke:models"][0].update(source="hf://Qwen/Qwen2.5-7B-Instruçt"),
     "vllm-gke:models[qwen-7b].source", "must be hf://"),
    ("secret-id", "dev", lambda v: v.update({"vllm-gke:weights": {"secretManagerSecret": "hf token"}}),
     "vllm-gke:weights.secretManagerSecret", "not a Secret Manager secret id"),
    ("secret-is-a-token", "dev",
     lambda v: v.update({"vllm-gke:weights": {"secretManagerSecret": "hf_" + "a" * 34}}),
     "vllm-gke:weights.secretManagerSecret", "looks like a token"),
    ("empty-tag", "dev", lambda v: v["vllm-gke:serverImage"].update(tag=""),
     "vllm-gke:serverImage.tag", "not a Docker tag"),
    ("tag-of-another-release", "dev", lambda v: v["vllm-gke:serverImage"].update(tag="v0.11.0-gke.1"),
     "vllm-gke:serverImage.tag", "not an image of vLLM 0.34.0"),
    ("repository-with-tag", "dev", lambda v: v["vllm-gke:serverImage"].update(repository="vllm/vllm-openai:v1"),
     "vllm-gke:serverImage.repository", "no tag or digest here"),
    # More tenant URLs behind the pickers than GKE's CEL conditions can name (10 of 512 characters).
    ("identity-conditions-overflow", "staging", lambda v: v["vllm-gke:tenants"].extend(
        {**copy.deepcopy(next(t for t in v["vllm-gke:tenants"] if "llama-8b" in t["models"])),
         "name": f"tenant-{i:03}", "models": ["llama-8b"]} for i in range(150)),
     "vllm-gke:tenants", "GKE takes at most 10 of 512 characters each"),
    # vLLM 0.11 serves no /v1/messages, which the picker's routes include.
    ("picker-routes-unserved", "staging", lambda v: v.update({"vllm-gke:vllmVersion": "0.11.0"}),
     "vllm-gke:models[llama-8b].routing", "/v1/messages, which vLLM 0.11.0 does not serve"),
    ("unsupported-vllm", "dev", lambda v: v.update({"vllm-gke:vllmVersion": "0.9.0"}),
     "vllm-gke:vllmVersion", "not supported"),
    ("canary-of-itself", "prod", lambda v: by_hand(v) or v["vllm-gke:models"][2]["canary"].update(revision="main"),
     "vllm-gke:models[llama-8b]", "canary.revision 'main' is the model's own revision"),
    ("canary-weight", "prod", lambda v: by_hand(v) or v["vllm-gke:models"][2]["canary"].update(weight=101),
     "vllm-gke:models[llama-8b].canary.weight", "100"),
    ("canary-revision", "prod", lambda v: by_hand(v) or v["vllm-gke:models"][2]["canary"].update(revision="v1..2"),
     "vllm-gke:models[llama-8b].canary.revision", "not a git branch"),
    # Inference Gateway: the GKE requirements and what one pool behind the picker cannot take.
    ("picker-on-a-global-gateway", "staging",
     lambda v: v["vllm-gke:gateway"].update(className="gke-l7-global-external-managed"),
     "vllm-gke:gateway.className", "cannot route to an InferencePool"),
    # Length routes match Content-Length by regular expression: the global external load balancer
    # has none (Compute API urlMaps, HttpHeaderMatch.regexMatch), so neither routing mode fits it.
    ("length-routes-on-a-global-gateway", "prod",
     lambda v: v["vllm-gke:gateway"].update(className="gke-l7-global-external-managed"),
     "vllm-gke:gateway.className", "cannot program length routes (models[llama-70b].routing is length)"),
    ("staging-mixed-on-a-global-gateway", "staging",
     lambda v: v["vllm-gke:gateway"].update(className="gke-l7-global-external-managed"),
     "vllm-gke:gateway.className", "use gke-l7-rilb or gke-l7-regional-external-managed"),
    ("picker-without-min-version", "staging", lambda v: v["vllm-gke:cluster"].pop("minMasterVersion"),
     "vllm-gke:cluster.minMasterVersion", "is unset, but models[llama-8b].routing is inference-gateway"),
    # The picker's two replicas on two system nodes (topology spread with minDomains 2).
    ("picker-on-one-system-node", "staging",
     lambda v: v["vllm-gke:cluster"].update(systemMaxNodes=1, systemMachineType="n2-standard-16"),
     "vllm-gke:cluster.systemMaxNodes", "replicas run on two system nodes"),
    ("picker-on-old-gke", "staging", lambda v: v["vllm-gke:cluster"].update(minMasterVersion="1.34.0-gke.1000"),
     "vllm-gke:cluster.minMasterVersion", "from 1.34.0-gke.1626000"),
    ("picker-on-1.33", "staging", lambda v: v["vllm-gke:cluster"].update(minMasterVersion="1.33"),
     "vllm-gke:cluster.minMasterVersion", "set it to 1.34 or later"),
    ("gke-version-format", "dev", lambda v: v["vllm-gke:cluster"].update(minMasterVersion="latest-ish"),
     "vllm-gke:cluster.minMasterVersion", "not a GKE version"),
    ("picker-with-a-long-pool", "staging",
     lambda v: v["vllm-gke:models"][0].update(long={"maxNumSeqs": 8}),
     "vllm-gke:models[llama-8b]", "long only apply to routing: length"),
    ("manual-canary-beside-rollouts", "prod",
     lambda v: v["vllm-gke:models"][2].update(canary={"revision": "v2", "weight": 10}),
     "vllm-gke:models[llama-8b].canary", "remove canary (Flagger rolls it out"),
    ("rollout-load-test-unknown", "prod", lambda v: v["vllm-gke:rollouts"].update(loadTests=["search-llama-8b", "nightly"]),
     "vllm-gke:rollouts.loadTests[1]", "'nightly' is not a load test: use one of analytics-qwen-7b, search-llama-70b"),
    ("rollouts-without-slos", "prod", lambda v: v["vllm-gke:monitoring"].update(slos={"enabled": False}),
     "vllm-gke:rollouts.enabled", "set monitoring.slos.enabled"),
    ("rollout-step-past-promotion", "prod", lambda v: v["vllm-gke:rollouts"].update(stepWeight=40, maxWeight=30),
     "vllm-gke:rollouts", "stepWeight 40 is above maxWeight 30"),
    ("picker-with-a-canary", "staging",
     lambda v: v["vllm-gke:models"][0].update(canary={"revision": "v2", "weight": 10}),
     "vllm-gke:models[llama-8b]", "canary needs routing: length"),
    ("picker-with-a-rate-cap", "staging",
     lambda v: v["vllm-gke:models"][0]["short"].update(maxRatePerEndpoint=5),
     "vllm-gke:models[llama-8b]", "balances by load"),
    # The picker's one pool serves its short maxModelLen, not the model's: the cap is checked there.
    ("picker-pool-shorter-than-the-cap", "staging",
     lambda v: (v["vllm-gke:models"][0]["short"].update(maxModelLen=1024),
                v["vllm-gke:models"][0].update(maxModelLen=16384)),
     "vllm-gke:tenants[search].maxTokens", "short.maxModelLen 1024"),
    ("routing-unknown", "dev", lambda v: v["vllm-gke:models"][0].update(routing="round-robin"),
     "vllm-gke:models[qwen-7b].routing", "inference-gateway"),
    ("tokens-without-the-shared-store", "staging",
     # Staging counts limits across replicas (its Cloud Run model's too): without the shared store.
     lambda v: (v["vllm-gke:tenants"][0]["rateLimit"].update(tokensPerMinute=100000),
                v["vllm-gke:globalLimits"].update(enabled=False)),
     "vllm-gke:tenants[search].rateLimit.tokensPerMinute", "set vllm-gke:globalLimits.enabled: true"),
    ("tokens-below-the-cap", "prod",
     lambda v: v["vllm-gke:tenants"][0]["rateLimit"].update(tokensPerMinute=1000),
     "vllm-gke:tenants[search].rateLimit.tokensPerMinute", "below the tenant's maxTokens 2048"),
    ("adapter-for-a-tenant-without-the-model", "prod",
     lambda v: v["vllm-gke:models"][2]["adapters"][0].update(tenants=["analytics"]),
     "vllm-gke:models[llama-8b].adapters[support-sql].tenants", "tenant 'analytics' may not call model 'llama-8b'"),
    ("adapter-rank", "prod", lambda v: v["vllm-gke:models"][2]["adapters"][0].update(rank=24),
     "vllm-gke:models[llama-8b].adapters[support-sql].rank", "not one vLLM serves"),
    # vLLM applies a LoRA named like a chat content part's type to every request with such a part.
    ("adapter-named-as-a-content-part", "prod", lambda v: v["vllm-gke:models"][2]["adapters"][0].update(name="image"),
     "vllm-gke:models[llama-8b].adapters[image].name", "content part type vLLM applies"),
    ("adapter-name-twice", "prod", lambda v: v["vllm-gke:models"][2]["adapters"][1].update(name="support-sql"),
     "vllm-gke:models[llama-8b]", "repeat a name"),
    ("adapter-named-as-the-model", "prod", lambda v: v["vllm-gke:models"][2]["adapters"][1].update(name="llama-8b"),
     "vllm-gke:models[llama-8b]", "repeat a name"),
    ("adapter-job-name", "dev", lambda v: (
        v["vllm-gke:models"][0].update(name="q" * 30, adapters=[
            {"name": "a" * 32, "source": "hf://org/lora", "tenants": ["dev-team"]}]),
        v["vllm-gke:tenants"][0].update(models=["q" * 30])),
     f"vllm-gke:models[{'q' * 30}].adapters[{'a' * 32}].name", "63 characters"),
    ("adapter-source", "prod", lambda v: v["vllm-gke:models"][2]["adapters"][0].update(source="https://x/y"),
     "vllm-gke:models[llama-8b].adapters[support-sql].source", "must be hf://"),
    ("adapter-without-tenants", "prod", lambda v: v["vllm-gke:models"][2]["adapters"][0].update(tenants=[]),
     "vllm-gke:models[llama-8b].adapters[support-sql].tenants", "at least 1"),
    ("lora-through-extra-args", "dev", lambda v: v["vllm-gke:models"][0].update(extraArgs=["--enable_lora"]),
     "vllm-gke:models[qwen-7b].extraArgs", "set models[].adapters"),
    ("max-loras-without-adapters", "dev", lambda v: v["vllm-gke:models"][0].update(maxLoras=2),
     "vllm-gke:models[qwen-7b]", "maxLoras needs adapters"),
    ("policy-names-collide", "dev", lambda v: (
        v["vllm-gke:models"].append({**v["vllm-gke:models"][0], "name": "team-qwen-7b"}),
        v["vllm-gke:tenants"].append({**v["vllm-gke:tenants"][0], "name": "dev", "models": ["team-qwen-7b"],
                                      "jwt": {"issuer": "https://auth.example/dev", "audiences": ["x"],
                                              "jwksUri": "https://auth.example/dev/jwks"}})),
     "vllm-gke:tenants[dev].name", "name the same policy 'allow-dev-team-qwen-7b'"),
    ("priority-range", "staging", lambda v: v["vllm-gke:tenants"][0].update(priority=-1000),
     "vllm-gke:tenants[search].priority", "-100"),
    # The picker's queue sheds before the load balancer's backend timeout cuts a queued request.
    ("picker-queue-past-the-backend-timeout", "staging",
     lambda v: v.update({"vllm-gke:picker": {"flowControl": {"queueTtlSeconds": 600}}}),
     "vllm-gke:picker.flowControl.queueTtlSeconds", "lower queueTtlSeconds"),
    ("picker-band-above-the-whole", "staging",
     lambda v: v.update({"vllm-gke:picker": {"flowControl": {"bandMaxRequests": 5000, "maxRequests": 100}}}),
     "vllm-gke:picker.flowControl", "lower bandMaxRequests or raise maxRequests"),
    ("picker-scores-nothing", "staging",
     lambda v: v.update({"vllm-gke:picker": {"scorers": {"queue": 0, "kvCacheUtilization": 0, "prefixCache": 0}}}),
     "vllm-gke:picker.scorers", "give queue, kvCacheUtilization or prefixCache a weight"),
    ("picker-failure-mode", "staging", lambda v: v.update({"vllm-gke:picker": {"failureMode": "FailClosed"}}),
     "vllm-gke:picker.failureMode", "'FailClosed' is not one of"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rejected_with_key_and_fix(stack_values, case):
    _id, stack, mutate, key, words = case
    values = copy.deepcopy(stack_values[stack])
    mutate(values)
    found = problems(values)
    assert any(p.startswith(key + ":") and words in p for p in found), found


def test_accepted_forms_stay_accepted(stack_values):
    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:models"][0].update(revision="refs/pr/12", extraArgs=["--enforce-eager", "--seed=7"])
    values["vllm-gke:gateway"]["hostname"] = "*.llm.acme.example"
    values["vllm-gke:models"][0]["enableChunkedPrefill"] = False
    values["vllm-gke:models"][0]["long"]["maxNumBatchedTokens"] = 8192
    parse(values)
    staging = copy.deepcopy(stack_values["staging"])
    for version in ("1.35", "1.34.1", "1.34.0-gke.1626000", "1.34.2-gke.1"):
        staging["vllm-gke:cluster"]["minMasterVersion"] = version
        parse(staging)


@pytest.mark.parametrize("base,role", [("a", "nodes"), ("x" * 32, "metrics"), ("vllm-prod-weights", "loader"),
                                       ("a" * 24 + "-bcdefg", "loader"), ("ab-", "nodes")])
def test_derived_service_account_ids_are_valid_and_distinct(base, role):
    ids = {service_account_id(base, r) for r in (role, "other-role", "x-role")}
    assert len(ids) == 3 and all(is_service_account_id(i) for i in ids)
    assert service_account_id("vllm-prod", "nodes") == "vllm-prod-nodes"  # short names are kept as they were


def test_long_cluster_names_plan(stack_values):
    from vllm_gke.infra.plan import run_program

    values = copy.deepcopy(stack_values["prod"])
    values["vllm-gke:cluster"]["name"] = "a" * 32
    plan = run_program("prod", values)
    for r in plan.of_type("gcp:serviceaccount/account:Account"):
        assert is_service_account_id(r.props["accountId"]), r.props["accountId"]


@pytest.mark.parametrize("text,words", [("{not json", "is not JSON"), ('["a"]', "not an object")])
def test_pulumi_config_that_is_not_a_json_object(text, words):
    env = {"PULUMI_CONFIG": text, "PATH": "/usr/bin:/bin"}
    code = ("from vllm_gke.infra.config import load, ConfigError\n"
            "try:\n    load()\nexcept ConfigError as e:\n    print(e); raise SystemExit(2)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "PULUMI_CONFIG" in result.stdout and words in result.stdout
    assert "Traceback" not in result.stderr


def test_cli_exits_2_with_the_key_and_no_traceback(tmp_path, stack_values):
    import yaml

    values = copy.deepcopy(stack_values["dev"])
    values["vllm-gke:cluster"]["masterCidr"] = "172.16.0.0/24"
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run([sys.executable, "-m", "vllm_gke.infra.cli", "plan", "--stack", "bad", "--stacks-dir", str(tmp_path),
                             "--no-write"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert "vllm-gke:cluster.masterCidr" in result.stdout and "/28" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    json.dumps(values)  # the case itself is plain data


def test_cli_names_a_misspelt_region_and_exits_2(tmp_path, stack_values):
    import yaml

    values = copy.deepcopy(stack_values["dev"])
    values["gcp:region"] = "europe-west-4"
    values["vllm-gke:cluster"]["zones"] = ["europe-west4-a"]
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run([sys.executable, "-m", "vllm_gke.infra.cli", "plan", "--stack", "bad", "--stacks-dir", str(tmp_path),
                             "--no-write"], cwd=REPO_ROOT, capture_output=True, text=True)
    out = " ".join(result.stdout.split())  # the terminal wraps the message
    assert result.returncode == 2, result.stdout + result.stderr
    assert "gcp:region" in out and "did you mean europe-west4?" in out
    assert "Traceback" not in result.stdout + result.stderr


def test_the_packages_cluster_check_names_its_own_region_key():
    """GpuCluster runs check_zones on its own inputs: an unknown region is named by its key there."""
    from vllm_gke.components.model.config_rules import check_zones

    found: list[tuple[str, str]] = []
    check_zones(lambda k, p: found.append((k, p)), "europe-west-4", ["europe-west4-a"], "cluster.zones", "region")
    assert found == [("region", "'europe-west-4' is not a Compute Engine region; did you mean europe-west4? "
                                "(cloud.google.com/compute/docs/regions-zones), and list zones of it under cluster.zones")]
