"""The Cloud Run models' load balancer (components/cloud_run_gateway.py): what Cloud Load Balancing
and Cloud Run take of a serverless NEG, and a check of each on the plan's resources."""

from __future__ import annotations

import re
from typing import Any

from ...components.model.cloud_run_gateway import (
    BEARER_JWT_EXPRESSION,
    DEFAULT_RULE_PRIORITY,
    RE2_REPEAT_MAX,
    THROTTLE_COUNT_MAX,
)
from ..plan import Plan
from .base import Contract

SERVERLESS_NEGS = "https://cloud.google.com/load-balancing/docs/negs/serverless-neg-concepts"
INTERNAL_SERVERLESS = "https://cloud.google.com/load-balancing/docs/l7-internal/setting-up-l7-internal-serverless"
RUN_INGRESS = "https://cloud.google.com/run/docs/securing/ingress"
APPLICATION_LB_SCHEMES = {"EXTERNAL_MANAGED", "INTERNAL_MANAGED"}
NEG = "gcp:compute/regionNetworkEndpointGroup:RegionNetworkEndpointGroup"
BACKENDS = ("gcp:compute/regionBackendService:RegionBackendService", "gcp:compute/backendService:BackendService")
SERVICE = "gcp:cloudrunv2/service:Service"
ARMOR_OVERVIEW = "https://cloud.google.com/armor/docs/security-policy-overview"
ARMOR_FEATURES = "https://docs.cloud.google.com/armor/docs/common-use-cases (Feature availability)"
ARMOR_RULES = "https://cloud.google.com/armor/docs/rules-language-reference"
ARMOR_RATE = "https://docs.cloud.google.com/armor/docs/rate-limiting-overview"
# A backend service's scope -> the policy type of that scope it takes.
POLICY_OF_BACKEND = {BACKENDS[0]: "gcp:compute/regionSecurityPolicy:RegionSecurityPolicy",
                     BACKENDS[1]: "gcp:compute/securityPolicy:SecurityPolicy"}


def _serverless_negs(plan: Plan) -> dict[str, dict[str, Any]]:
    """Logical name + '-id' (the mocks' id, what a backend's group names) -> a serverless NEG's props."""
    return {f"{r.name}-id": r.props for r in plan.of_type(NEG) if r.props.get("networkEndpointType") == "SERVERLESS"}


def _serverless_backends(plan: Plan, types: tuple[str, ...] = BACKENDS) -> list[tuple[str, dict[str, Any],
                                                                                    list[dict[str, Any]]]]:
    """(name, props, its serverless NEGs) of each backend service with a serverless NEG."""
    negs = _serverless_negs(plan)
    out = []
    for type_ in types:
        for r in plan.of_type(type_):
            found = [negs[b["group"]] for b in r.props.get("backends") or [] if b.get("group") in negs]
            if found:
                out.append((str(r.props.get("name")), r.props, found))
    return out


def serverless_negs_behind_an_application_lb(plan: Plan) -> list[str]:
    """A serverless NEG's backend service is an Application Load Balancer's, and a regional one's NEGs
    are in its region."""
    out = []
    for name, props, negs in _serverless_backends(plan):
        if props.get("loadBalancingScheme") not in APPLICATION_LB_SCHEMES:
            out.append(f"backend service {name} ({props.get('loadBalancingScheme')}) takes a serverless NEG: only "
                       "Application Load Balancers (EXTERNAL_MANAGED, INTERNAL_MANAGED) do")
        region = props.get("region")
        out += [f"serverless NEG {n.get('name')} is in {n.get('region')}, not in its load balancer's region ({region})"
                for n in negs if region and n.get("region") != region]
    return out


def serverless_backends_without_health_check_or_timeout(plan: Plan) -> list[str]:
    """Google refuses a health check and a timeoutSec on a serverless NEG's backend service."""
    return [f"backend service {name} sets {key} with a serverless NEG, which the API refuses (Cloud Run's request "
            "timeout bounds a request)"
            for name, props, _negs in _serverless_backends(plan) for key in ("healthChecks", "timeoutSec")
            if props.get(key) not in (None, [], "")]


def cloud_run_ingress_admits_the_load_balancer(plan: Plan) -> list[str]:
    """Each NEG's Cloud Run service exists in the NEG's region and its ingress admits the load balancer:
    'internal' admits internal Application Load Balancers only, 'internal and Cloud Load Balancing'
    external ones too."""
    services = {(r.props.get("name"), r.props.get("location")): r.props for r in plan.of_type(SERVICE)}
    out = []
    for name, props, negs in _serverless_backends(plan):
        admits = {"INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", "INGRESS_TRAFFIC_ALL"}
        if props.get("loadBalancingScheme") == "INTERNAL_MANAGED":
            admits.add("INGRESS_TRAFFIC_INTERNAL_ONLY")
        for neg in negs:
            target = (neg.get("cloudRun") or {}).get("service")
            service = services.get((target, neg.get("region")))
            if service is None:
                out.append(f"serverless NEG {neg.get('name')} names Cloud Run service {target} in "
                           f"{neg.get('region')}, which the plan does not declare there")
            elif (ingress := service.get("ingress") or "INGRESS_TRAFFIC_ALL") not in admits:
                out.append(f"Cloud Run service {target}'s ingress {ingress} does not admit backend service {name}'s "
                           f"load balancer ({props.get('loadBalancingScheme')}); use one of {sorted(admits)}")
    return out


def _invoker_off(plan: Plan, negs: list[dict[str, Any]]) -> bool:
    """Whether a NEG's Cloud Run service has the invoker check off (auth jwt)."""
    services = {(r.props.get("name"), r.props.get("location")): r.props for r in plan.of_type(SERVICE)}
    return any((services.get(((n.get("cloudRun") or {}).get("service"), n.get("region"))) or {}).get("invokerIamDisabled")
               for n in negs)


def invoker_off_backends_carry_a_cloud_armor_policy(plan: Plan) -> list[str]:
    """A serverless backend whose Cloud Run service has the invoker check off names a CLOUD_ARMOR policy
    the plan declares, of the backend's own scope (and region), on an external load balancer."""
    out = []
    for type_, policy_type in POLICY_OF_BACKEND.items():
        policies = {f"{r.name}-id": r.props for r in plan.of_type(policy_type)}
        for name, props, negs in _serverless_backends(plan, (type_,)):
            if not _invoker_off(plan, negs):
                continue
            policy = policies.get(str(props.get("securityPolicy")))
            if policy is None:
                out.append(f"backend service {name} reaches a Cloud Run service with the invoker check off but has no "
                           f"Cloud Armor policy of its scope ({policy_type.split(':')[-1]}): a request without a token "
                           "would start an instance")
            elif policy.get("type") != "CLOUD_ARMOR" or policy.get("region") != props.get("region"):
                out.append(f"backend service {name}'s policy {policy.get('name')} is {policy.get('type')} in "
                           f"{policy.get('region') or 'global'}, not CLOUD_ARMOR in {props.get('region') or 'global'}")
            elif props.get("loadBalancingScheme") != "EXTERNAL_MANAGED":
                out.append(f"backend service {name} ({props.get('loadBalancingScheme')}) is not an external "
                           "Application Load Balancer's: Cloud Armor's custom rules and rate limiting are documented "
                           "for those only")
    return out


def _repeats_within_re2(pattern: str) -> bool:
    return all(int(n) <= RE2_REPEAT_MAX for n in re.findall(r"\{(?:\d+,)?(\d+)\}", pattern))


def _rule_problems(name: str, rules: list[dict[str, Any]]) -> list[str]:
    """What is wrong with one policy's rules against Cloud Armor's language and limits."""
    by_priority = sorted(rules, key=lambda r: int(r.get("priority", 0)))
    out = []
    default = by_priority[-1] if by_priority else {}
    if default.get("priority") != DEFAULT_RULE_PRIORITY or not str(default.get("action", "")).startswith("deny("):
        out.append(f"policy {name}'s default rule (priority {DEFAULT_RULE_PRIORITY}) must deny: it is "
                   f"{default.get('action')} at {default.get('priority')}, so a request without a token passes")
    for rule in by_priority[:-1]:
        expression = (((rule.get("match") or {}).get("expr")) or {}).get("expression", "")
        found = re.search(r"request\.headers\['authorization'\]\.matches\('([^']*)'\)", expression)
        if not found or not (found.group(1).startswith("^") and found.group(1).endswith("$")):
            out.append(f"policy {name}'s rule {rule.get('priority')} does not match the whole Authorization header "
                       f"(matches() is a partial match: anchor it ^...$): {expression}")
        elif not _repeats_within_re2(found.group(1)):
            out.append(f"policy {name}'s rule {rule.get('priority')} repeats more than RE2's {RE2_REPEAT_MAX}")
        options = rule.get("rateLimitOptions") or {}
        count = (options.get("rateLimitThreshold") or {}).get("count", 0)
        if rule.get("action") in ("throttle", "rate_based_ban") and (
                options.get("enforceOnKey") != "IP" or not 1 <= count <= THROTTLE_COUNT_MAX):
            out.append(f"policy {name}'s rule {rule.get('priority')} limits per {options.get('enforceOnKey')} at "
                       f"{count}: it must be per IP, 1 to {THROTTLE_COUNT_MAX:,}")
    return out


def armor_rules_pass_only_whole_bearer_jwts(plan: Plan) -> list[str]:
    """Each Cloud Armor policy on a Cloud Run backend: a default rule that denies, and above it only
    rules matching the whole Authorization header, limited per IP within Cloud Armor's bounds."""
    attached = {str(p.get("securityPolicy")) for _n, p, _negs in _serverless_backends(plan)}
    return [problem for type_ in POLICY_OF_BACKEND.values() for r in plan.of_type(type_) if f"{r.name}-id" in attached
            for problem in _rule_problems(str(r.props.get("name")), list(r.props.get("rules") or []))]


ROWS: tuple[Contract, ...] = (
    Contract("Cloud Load Balancing (serverless NEG)", "Compute API v1",
             "serverless NEGs are taken by the regional internal, cross-region internal, global external, classic "
             "and regional external Application Load Balancers, not by proxy or passthrough Network Load "
             "Balancers; \"the serverless NEG, the load balancer, and any client VMs must be in the same region as "
             "the Cloud Run service\" (regional internal)",
             f"{SERVERLESS_NEGS} (Supported load balancers); {INTERNAL_SERVERLESS} (Deploy a Cloud Run service)",
             "the Cloud Run models' backend services are EXTERNAL_MANAGED or INTERNAL_MANAGED, of the gateway's class; "
             "a regional class takes models in the stack's region only (config_rules/cloud_run_gateway.py)",
             serverless_negs_behind_an_application_lb),
    Contract("Cloud Load Balancing (serverless NEG)", "Compute API v1",
             "a backend service with a serverless NEG takes no health check and no timeoutSec (\"Timeout sec is not "
             "supported for a backend service with Serverless network endpoint groups\"); Cloud Run's request "
             "timeout (default 300 s, at most 3600 s) bounds a request instead",
             f"{SERVERLESS_NEGS}#backend-service-limitations; "
             "https://cloud.google.com/run/docs/configuring/request-timeout",
             "the Cloud Run models' backend services set neither (components/cloud_run_gateway.py); the service's "
             "request timeout is the long-generation bound",
             serverless_backends_without_health_check_or_timeout),
    Contract("Cloud Run (ingress)", "Cloud Run Admin API v2",
             "ingress 'internal' admits internal Application Load Balancers (and the VPC), 'internal and Cloud Load "
             "Balancing' external Application Load Balancers too; a serverless NEG names its service and region",
             f"{RUN_INGRESS}; {SERVERLESS_NEGS}",
             "each serverless NEG names a Cloud Run service the plan declares in the NEG's region, whose ingress "
             "admits that load balancer",
             cloud_run_ingress_admits_the_load_balancer),
    Contract("Cloud Armor (backend security policy)", "Compute API v1; pulumi_gcp 10.2.0",
             "backend security policies are available for all external Application Load Balancers and the regional "
             "internal one, their backends including serverless NEGs (Cloud Run); a global load balancer's backend "
             "service takes a global policy (compute.SecurityPolicy), a regional one's a policy of its region "
             "(compute.RegionSecurityPolicy), type CLOUD_ARMOR; custom CEL rules are listed for external Application "
             "Load Balancers only",
             f"{ARMOR_OVERVIEW}; {ARMOR_FEATURES}; pulumi_gcp/compute/region_security_policy.py (type)",
             "each backend service in front of a Cloud Run service with the invoker check off (auth jwt) names a "
             "CLOUD_ARMOR policy of its own scope and region, on an external class; auth jwt with the internal class "
             "is refused (config_rules/cloud_run_gateway.py); auth iam models carry none",
             invoker_off_backends_carry_a_cloud_armor_policy),
    Contract("Cloud Armor (rules language, rate limiting)", "Compute API v1; pulumi_gcp 10.2.0",
             "request.headers is a string-to-string map with lowercase keys, a repeated header's values joined by "
             "commas; x.matches(y) is a partial RE2 match (RE2 counts repeats up to 1,000); the rule at priority "
             "2147483647 is the default (the provider adds an allowing one if none is given); throttle and "
             "rate_based_ban take rateLimitOptions (enforceOnKey IP, a threshold count of 1 to 1,000,000 for a "
             "throttle, exceedAction deny(429)); deny takes 403, 404 or 502",
             f"{ARMOR_RULES} (Attributes, Operations); {ARMOR_RATE}; "
             "pulumi_gcp/compute/_inputs.py (RegionSecurityPolicyRuleArgs.action)",
             f"the default rule denies (403) and above it only a throttle per IP on {BEARER_JWT_EXPRESSION[:60]}..., "
             "anchored, so a request without one well-formed bearer JWT never reaches Cloud Run",
             armor_rules_pass_only_whole_bearer_jwts),
)
