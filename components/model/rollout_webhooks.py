"""A Flagger canary's load-test webhooks: the stack's load test (components/load_test.py, a suspended
CronJob running inference-perf through a tenant's route) started as a Job by Flagger's loadtester, so
the canary's analysis has traffic to judge at any hour.

Flagger POSTs a webhook's `metadata` to its URL (pkg/controller/webhook.go:52-116 at v1.44.0): a
`pre-rollout` webhook once before the first step, a `rollout` webhook at every interval before the
gates are read (pkg/controller/scheduler.go:449-467, 752-763); a failure of either counts as a failed
check. The loadtester runs a `bash` task's `cmd` with `bash -c` and answers only when it has finished,
500 when it failed (pkg/loadtester/server.go:309-336, bash.go:37-51): blocking, so the command must
be quick. A `kubectl` task splits its command on spaces with no shell (kubectl.go:22-27), which could
not test the Job's state first: hence bash.

The load test's prompts rarely reach the long pool (its route sends there only requests of at least
the model's longRequestBytes, or hinted `x-vllm-gke-length: long`: components/model/gateway_routes.py),
so a long pool's canary would see next to no traffic. A load test that reaches a Flagger long pool
has a second CronJob, `loadtest-<name>-long`, whose every request carries the hint
(components/load_test.py); the long pool's canary starts that one, the short pool's the plain one.

The command is idempotent across intervals: one Job per CronJob (`<cronjob>-canary`), started where
there is none, left alone while it runs, deleted and started again once it has finished (the load
test runs for minutes; an analysis lasts longer). A Job someone else deleted first (a person, the
TTL controller) is as good as ours deleted. It needs, in the CronJob's namespace, `get` on that
CronJob and `get`/`delete` on that Job by name, and `create` on Jobs (which RBAC cannot limit by
name): `loadtester_rules`. `kubectl delete` does not wait (its wait would need list and watch); the
command polls the Job by name instead.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

# Flagger's webhook timeout (its default is 10 s: webhook.go:111-113); the command's own polling
# ends well before it.
WEBHOOK_TIMEOUT = "60s"
# Seconds the command waits for a finished Job to be gone before it starts the next.
DELETE_WAIT_SECONDS = 30
# The long-pool variant's CronJob: loadtest-<name>-long.
LONG_SUFFIX = "-long"


@dataclass(frozen=True)
class LoadTestRef:
    """A load test as Flagger starts it: its name (loadTests[].name), its CronJob's namespace, and
    whether the variant whose requests go to the long pool (a long pool's canary starts that one)."""

    name: str
    namespace: str
    long: bool = False

    @property
    def cron_job(self) -> str:
        """The suspended CronJob components/load_test.py declares (load_test.cron_job_name)."""
        return f"loadtest-{self.name}{LONG_SUFFIX if self.long else ''}"

    @property
    def job(self) -> str:
        """The one Job the canary's webhooks keep running."""
        return f"{self.cron_job}-canary"


def start_command(ref: LoadTestRef) -> str:
    """bash: start the load test's Job unless one runs; a finished one is replaced. A finished Job
    gone before our delete (NotFound), or one created by someone else in between (AlreadyExists), is
    as good as ours: neither fails the webhook."""
    kubectl = f"kubectl -n {shlex.quote(ref.namespace)}"
    job = shlex.quote(ref.job)
    done = "{.status.conditions[?(@.status==\"True\")].type}"
    return "\n".join([
        "set -eu",
        f"state=$({kubectl} get job {job} --ignore-not-found -o {shlex.quote('jsonpath={.metadata.name}:' + done)})",
        'case "$state" in',
        '  "") ;;',
        f"  *:*Complete*|*:*Failed*) {kubectl} delete job {job} --ignore-not-found --wait=false",
        f"    for ((i = 0; i < {DELETE_WAIT_SECONDS}; i++)); do",
        f'      [ -z "$({kubectl} get job {job} --ignore-not-found -o name)" ] && break; sleep 1',
        "    done ;;",
        f'  *) echo "{ref.job} is running"; exit 0 ;;',
        "esac",
        f"{kubectl} create job {job} --from=cronjob/{shlex.quote(ref.cron_job)} || {kubectl} get job {job} -o name",
    ])


def load_test_webhooks(ref: LoadTestRef, loadtester_url: str) -> tuple[dict[str, Any], ...]:
    """A Canary's analysis.webhooks (Flagger's CanaryWebhook: pkg/apis/flagger/v1beta1/canary.go:433-461):
    the load test started before the first step, and kept running at every step."""
    metadata = {"type": "bash", "cmd": start_command(ref)}
    return tuple({"name": f"{hook}-{ref.cron_job}", "type": hook, "url": loadtester_url,
                  "timeout": WEBHOOK_TIMEOUT, "metadata": dict(metadata)}
                 for hook in ("pre-rollout", "rollout"))


def loadtester_rules(refs: list[LoadTestRef]) -> list[dict[str, Any]]:
    """A Role's rules in one namespace for the load tests whose CronJobs are there: what
    `start_command` does, and nothing more."""
    return [
        {"apiGroups": ["batch"], "resources": ["cronjobs"], "resourceNames": sorted({r.cron_job for r in refs}),
         "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": sorted({r.job for r in refs}),
         "verbs": ["get", "delete"]},
        # Create carries no name to authorize by (RBAC resourceNames cannot limit it).
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
    ]
