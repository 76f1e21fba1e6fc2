"""LoadTest: an on-demand load test of one tenant's route, as that tenant, with an existing tool.

A suspended CronJob - `pulumi up` never starts it; `kubectl -n <ns> create job --from=cronjob/
loadtest-<name> loadtest-<name>-1` does - running kubernetes-sigs/inference-perf (pinned) through
components/scripts/run_load_test.py: a mixed workload of streamed completions (prompt and output
lengths from long-tailed distributions; Poisson arrivals over steady and burst stages; the model's
adapters mixed in where the tenant may use them), then, where configured, a phase whose prompts
share long prefixes in groups (the prefix cache's case). It calls the tenant's public URL with the
tenant's token (a Kubernetes Secret the operator creates: no token passes through Pulumi), so it
measures what the tenant gets - gateway, mesh, guard, replica - and reports TTFT and inter-token
latency p50/p99, tokens/s and dollars per million tokens against the SLOs (the Job fails on too
many errors or a missed SLO).

The pod runs in the namespace of the replicas it tests, outside the mesh (it is a client, like the
tenant), as its own service account, and mounts the model's weights read-only for the model's own
tokenizer (inference-perf sizes prompts with it; offline). Reports go to an emptyDir and the log.

Where a Flagger canary of the model's long pool needs its traffic (components/model/rollout_webhooks.py),
a second CronJob `loadtest-<name>-long` runs the same test with every request hinted
`x-vllm-gke-length: long`, which the route sends to the long pool whatever its length (the plain
test's prompts reach it only past the model's longRequestBytes: a few percent of them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import yaml

from .k8s_meta import api_body, meta
from .model.gateway_routes import LENGTH_HINT_HEADER
from .model.k8s_objects import CONTAINER_SECURITY, content_digest
from .model.rollout_webhooks import LONG_SUFFIX
from .model.specs import LoadTestSpec, TokenLengths
from .model.weights_layout import MOUNT_PATH
from .model.weights_mount import WeightsMount
from .options import child_opts
from .weights_storage import ReaderWeights

PROGRAM = "run_load_test.py"
SERVICE_ACCOUNT = "vllm-loadtest"
# inference-perf's image has no USER (python:3.12-alpine, root); the Job runs it as this one.
LOADTEST_UID = 65532
CONFIG_DIR = "/etc/loadtest"
TOKEN_DIR = "/var/run/secrets/loadtest"
REPORTS_DIR = "/reports"
# Its load generator's processes (num_workers; upstream defaults to the node's CPU count).
WORKERS = 2


def program_text() -> str:
    return (Path(__file__).parent / "scripts" / PROGRAM).read_text()


def _lengths(d: TokenLengths) -> dict[str, Any]:
    return {"type": d.distribution, "mean": d.mean, "std_dev": d.std_dev, "min": d.min, "max": d.max}


@dataclass
class Target:
    """What the test calls: the tenant's route and what the model serves."""

    # The tenant's base URL without /v1 (inference-perf appends /v1/completions).
    base_url: str
    # The served model name, and the adapters the tenant may ask for by name.
    model: str
    adapters: Sequence[str] = ()
    # Headers every request of the tenant's carries (behind the endpoint picker, its objective).
    headers: Mapping[str, str] = field(default_factory=dict[str, str])
    # The model's directory on the weights mount (its tokenizer).
    model_dir: str = ""
    # The gateway's backend timeout: a request may take that long.
    request_timeout_seconds: int = 600


def long_pool_target(target: Target) -> Target:
    """The target as the long-pool variant calls it: every request hinted to the long pool
    (inference-perf 0.7.0 sends api.headers on every request: client/modelserver/openai_client.py:475-476)."""
    return replace(target, headers={**target.headers, LENGTH_HINT_HEADER: "long"})


def model_folder(target: Target) -> str:
    """The model's folder in the bucket (every revision of it): where its tokenizer is."""
    return target.model_dir.removeprefix(f"{MOUNT_PATH}/").split("/")[0] if target.model_dir else target.model


def lora_split(names: Sequence[str]) -> list[dict[str, Any]]:
    """Equal shares that sum to exactly 1.0 in floating point (inference-perf compares the sum with
    1.0: config/loadgen/config.py:256-260)."""
    shares = [1 / len(names)] * (len(names) - 1)
    shares.append(1.0 - sum(shares))
    assert sum(shares) == 1.0
    return [{"name": n, "split": share} for n, share in zip(names, shares)]


def phases(spec: LoadTestSpec, target: Target, reports_dir: str = REPORTS_DIR,
           ttft_goal: float = 0.95) -> list[tuple[str, dict[str, Any]]]:
    """(name, inference-perf config) for each phase."""
    common = {
        "server": {"type": "vllm", "model_name": target.model, "base_url": target.base_url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": target.model_dir},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": False,
                                         "percentiles": read_percentiles(ttft_goal)}},
    }
    api = {"streaming": True, **({"headers": dict(target.headers)} if target.headers else {})}
    load: dict[str, Any] = {"type": "poisson", "num_workers": WORKERS, "worker_max_concurrency": 256,
                            "request_timeout": target.request_timeout_seconds,
                            "stages": [{"rate": s.rate, "duration": s.duration_seconds} for s in spec.stages]}
    if spec.lora_mix and target.adapters:
        load["lora_traffic_split"] = lora_split([target.model, *target.adapters])
    out = [("mixed", {**common, "api": {"type": "completion", **api},
                      "data": {"type": "random", "input_distribution": _lengths(spec.prompt_tokens),
                               "output_distribution": _lengths(spec.output_tokens)},
                      "load": load,
                      "storage": {"local_storage": {"path": f"{reports_dir}/mixed"}}})]
    if spec.shared_prefix:
        sp = spec.shared_prefix
        # Text prefixes go out as completions whatever the API type (inference-perf 0.7.0
        # datagen/synthetic/shared_prefix_datagen.py:157-183).
        out.append(("shared-prefix", {**common, "api": {"type": "completion", **api},
                                      "data": {"type": "shared_prefix", "shared_prefix": {
                                          "num_groups": sp.groups, "num_prompts_per_group": sp.prompts_per_group,
                                          "system_prompt_len": sp.prefix_tokens, "question_len": sp.question_tokens,
                                          "output_len": sp.output_tokens}},
                                      "load": {"type": "concurrent", "num_workers": WORKERS,
                                               "request_timeout": target.request_timeout_seconds,
                                               "stages": [{"num_requests": sp.groups * sp.prompts_per_group,
                                                           "concurrency_level": sp.concurrency}]},
                                      "storage": {"local_storage": {"path": f"{reports_dir}/shared-prefix"}}}))
    return out


# The percentiles the TTFT objective's share may pick (the smallest at or above it). The configs
# name every percentile the verdict reads (report.request_lifecycle.percentiles, which the summary
# names "median" for 50 and "p<n>" otherwise) rather than lean on the tool's default list.
REPORTED_PERCENTILES = (90, 95, 99, 99.9)
# The verdict's own: p50 and p99 of TTFT and inter-token latency.
VERDICT_PERCENTILES = (50, 99)


def _ttft_percentile(goal: float) -> float:
    return next((p for p in REPORTED_PERCENTILES if p >= goal * 100 - 1e-9), REPORTED_PERCENTILES[-1])


def ttft_percentile_key(goal: float) -> str:
    """The reported TTFT percentile that holds the objective: the smallest at or above its share
    (0.95 -> p95, 0.98 -> p99), p99.9 above that."""
    return f"p{_ttft_percentile(goal):g}"


def read_percentiles(goal: float) -> list[float]:
    """Every percentile the verdict reads, for the configs to ask for explicitly."""
    return sorted({*VERDICT_PERCENTILES, _ttft_percentile(goal)})


def job_files(spec: LoadTestSpec, target: Target, ttft_slo_seconds: float, dollars_per_hour: Optional[float],
              config_dir: str = CONFIG_DIR, reports_dir: str = REPORTS_DIR, ttft_goal: float = 0.95,
              availability: float = 0.99) -> dict[str, str]:
    """What the Job's ConfigMap holds: each phase's inference-perf config, the plan the program
    follows (phases, SLO, cost, failure ratio) and the program. The SLO's TTFT is a share of
    requests under ttftSloSeconds (`ttft_goal`), so the verdict holds that percentile to it; the
    failures it takes default to what the availability objective allows."""
    found = phases(spec, target, reports_dir, ttft_goal)
    failures = spec.max_failure_ratio if spec.max_failure_ratio is not None else round(1 - availability, 6)
    plan = {"phases": [{"name": n, "configFile": f"{config_dir}/{n}.yaml"} for n, _ in found],
            "ttftSloSeconds": ttft_slo_seconds, "ttftPercentile": ttft_percentile_key(ttft_goal),
            "dollarsPerHour": None if dollars_per_hour is None else round(dollars_per_hour, 4),
            "maxFailureRatio": failures, "reportsDir": reports_dir}
    return {**{f"{n}.yaml": yaml.safe_dump(c, sort_keys=False) for n, c in found},
            "plan.json": json.dumps(plan, indent=1), PROGRAM: program_text()}


def deadline_seconds(spec: LoadTestSpec, request_timeout_seconds: int) -> int:
    """How long the Job may run: its stages, the longest request after them, and start-up."""
    stages = sum(s.duration_seconds for s in spec.stages)
    shared = spec.shared_prefix.groups * spec.shared_prefix.prompts_per_group * 2 if spec.shared_prefix else 0
    return stages + shared + 2 * request_timeout_seconds + 300


@dataclass
class LoadTestArgs:
    spec: LoadTestSpec
    provider: k8s.Provider
    # The namespace of the replicas the tenant's route reaches.
    namespace: pulumi.Input[str]
    target: Target
    # The TTFT objective (seconds, and the share of requests under it: the percentile the verdict
    # holds to it), and the pools' dollars an hour at their floor (None: no price, no dollar figure).
    ttft_slo_seconds: float
    dollars_per_hour: Optional[float]
    # The model's files as the store hands a reader in that namespace (ModelStore.reader_for): its
    # mount, and on a bucket what the test's own identity is granted (the list role, its model's folder).
    weights: ReaderWeights
    ttft_goal: float = 0.95
    # The availability objective: the failures the Job takes unless the test sets maxFailureRatio.
    availability: float = 0.99
    # Declare the long-pool variant too (loadtest-<name>-long): a Flagger canary of the long pool starts it.
    long_variant: bool = False


def container(spec: LoadTestSpec, weights: WeightsMount) -> dict[str, Any]:
    """inference-perf through the program, the model's files read-only for its tokenizer (offline)."""
    return {
        "name": "inference-perf", "image": spec.image.uri,
        "command": ["python", f"{CONFIG_DIR}/{PROGRAM}"],
        "env": [{"name": "LOADTEST_PLAN", "value": f"{CONFIG_DIR}/plan.json"},
                {"name": "LOADTEST_AUTH_DIR", "value": TOKEN_DIR},
                {"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
                {"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": {"cpu": str(WORKERS), "memory": "4Gi"},
                      "limits": {"cpu": str(WORKERS), "memory": "4Gi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
                         *weights.mounts,
                         {"name": "reports", "mountPath": REPORTS_DIR},
                         {"name": "tmp", "mountPath": "/tmp"},
                         # Its worker processes share memory through /dev/shm.
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def pod_spec(spec: LoadTestSpec, config_map: str, weights: WeightsMount) -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "serviceAccountName": f"{SERVICE_ACCOUNT}-{spec.name}",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": LOADTEST_UID,
                            "runAsGroup": LOADTEST_UID, "fsGroup": LOADTEST_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container(spec, weights)],
        "volumes": [{"name": "config", "configMap": {"name": config_map}},
                    {"name": "token", "secret": {"secretName": spec.token_secret_name, "defaultMode": 0o440}},
                    *weights.volumes,
                    {"name": "reports", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
    }


def cron_job_spec(spec: LoadTestSpec, target: Target, labels: Mapping[str, str], config_map: str,
                  files: Mapping[str, str], weights: WeightsMount) -> dict[str, Any]:
    """Suspended: run on demand only (`kubectl create job --from=cronjob/...`); a schedule is required."""
    return {
        "suspend": True, "schedule": "0 0 1 1 *", "concurrencyPolicy": "Forbid",
        "jobTemplate": {"metadata": {"labels": dict(labels)}, "spec": {
            "backoffLimit": 0,  # a load test is not retried blindly
            "activeDeadlineSeconds": deadline_seconds(spec, target.request_timeout_seconds),
            "ttlSecondsAfterFinished": 7 * 86400,
            "template": {
                "metadata": {"labels": {**labels, "sidecar.istio.io/inject": "false"},
                             "annotations": {"vllm-gke.io/config-sha256": content_digest(
                                 json.dumps(files, sort_keys=True)), **weights.annotations}},
                "spec": pod_spec(spec, config_map, weights),
            },
        }},
    }


class LoadTest(pulumi.ComponentResource):
    cron_job: k8s.batch.v1.CronJob
    # The long-pool variant's, where declared (LoadTestArgs.long_variant).
    long_cron_job: Optional[k8s.batch.v1.CronJob]
    phases: list[tuple[str, dict[str, Any]]]

    def __init__(self, name: str, args: LoadTestArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("vllm-gke:index:LoadTest", name, None, opts)
        spec, target = args.spec, args.target
        k8s_opts = child_opts(self, opts, provider=args.provider)
        obj = f"loadtest-{spec.name}"
        labels = {"app.kubernetes.io/name": "vllm-gke-loadtest", "vllm-gke.io/load-test": spec.name}
        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=self._md(f"{SERVICE_ACCOUNT}-{spec.name}", labels, args),
                                        automount_service_account_token=False, opts=k8s_opts)
        deps: list[pulumi.Resource] = [sa]
        reads = args.weights.bucket_reads
        if reads is not None:
            # It lists the bucket (to mount it) and opens its model's folder alone (the tokenizer).
            deps.extend(reads.grant(f"{name}-weights-reader", args.namespace, f"{SERVICE_ACCOUNT}-{spec.name}",
                                    [f"{model_folder(target)}/"], child_opts(self, opts)))
        self.phases = phases(spec, target, ttft_goal=args.ttft_goal)
        self.cron_job = self._variant(name, obj, target, labels, args, deps, opts)
        self.long_cron_job = self._variant(
            f"{name}{LONG_SUFFIX}", f"{obj}{LONG_SUFFIX}", long_pool_target(target),
            {**labels, "vllm-gke.io/load-test-variant": "long"}, args, deps, opts) if args.long_variant else None
        run = "kubectl -n {ns} create job --from=cronjob/{cron} {cron}-$(date +%s)"
        self.register_outputs({"cronJob": obj, "longCronJob": f"{obj}{LONG_SUFFIX}" if args.long_variant else None,
                               "phases": [n for n, _ in self.phases],
                               "run": pulumi.Output.from_input(args.namespace).apply(
                                   lambda ns: run.format(ns=ns, cron=obj))})

    @staticmethod
    def _md(n: str, labels: Mapping[str, str], args: LoadTestArgs) -> k8s.meta.v1.ObjectMetaArgsDict:
        return {**meta(n, labels=dict(labels)), "namespace": args.namespace}

    def _variant(self, name: str, obj: str, target: Target, labels: Mapping[str, str], args: LoadTestArgs,
                 deps: list[pulumi.Resource], opts: Optional[pulumi.ResourceOptions]) -> k8s.batch.v1.CronJob:
        """A CronJob `obj` and its ConfigMap of the same name (the test's configs for `target`)."""
        data = job_files(args.spec, target, args.ttft_slo_seconds, args.dollars_per_hour, ttft_goal=args.ttft_goal,
                         availability=args.availability)
        config = k8s.core.v1.ConfigMap(f"{name}-config", metadata=self._md(obj, labels, args), data=data,
                                       opts=child_opts(self, opts, provider=args.provider))
        return k8s.batch.v1.CronJob(
            f"{name}-cron", metadata=self._md(obj, labels, args),
            spec=api_body(cron_job_spec(args.spec, target, labels, obj, data, args.weights.mount)),
            opts=child_opts(self, opts, provider=args.provider, depends_on=[config, *deps]))
