"""The Cloud Run models' load balancer (components/cloud_run_gateway.py): what Cloud Load Balancing
and Cloud Run take of a serverless NEG, and a check of each on the plan's resources."""

from __future__ import annotations

from typing import Any

from ..plan import Plan
from .base import Contract

SERVERLESS_NEGS = "https://cloud.google.com/load-balancing/docs/negs/serverless-neg-concepts"
INTERNAL_SERVERLESS = "https://cloud.google.com/load-balancing/docs/l7-internal/setting-up-l7-internal-serverless"
RUN_INGRESS = "https://cloud.google.com/run/docs/securing/ingress"
APPLICATION_LB_SCHEMES = {"EXTERNAL_MANAGED", "INTERNAL_MANAGED"}
NEG = "gcp:compute/regionNetworkEndpointGroup:RegionNetworkEndpointGroup"
BACKENDS = ("gcp:compute/regionBackendService:RegionBackendService", "gcp:compute/backendService:BackendService")
SERVICE = "gcp:cloudrunv2/service:Service"


def _serverless_negs(plan: Plan) -> dict[str, dict[str, Any]]:
    """Logical name + '-id' (the mocks' id, what a backend's group names) -> a serverless NEG's props."""
    return {f"{r.name}-id": r.props for r in plan.of_type(NEG) if r.props.get("networkEndpointType") == "SERVERLESS"}


def _serverless_backends(plan: Plan) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(name, props, its serverless NEGs) of each backend service with a serverless NEG."""
    negs = _serverless_negs(plan)
    out = []
    for type_ in BACKENDS:
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
)
