"""Structural JSON schemas for the custom resources this library emits.

kubernetes-validate ships schemas for built-in kinds only. These are the parts of the
upstream CRD OpenAPI schemas (Gateway API v1.2, GKE networking.gke.io/v1, Istio 1.24
security/v1, GMP monitoring/v1, GKE ComputeClass, Secrets Store CSI v1) that cover the
fields we set: unknown fields are rejected and enums are enforced, so a typo in a
component fails the test suite instead of the API server.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
BOOL: Schema = {"type": "boolean"}
STRS: Schema = {"type": "array", "items": STR}
STR_MAP: Schema = {"type": "object", "additionalProperties": STR}
PORT: Schema = {"type": "integer", "minimum": 1, "maximum": 65535}


def obj(required: tuple[str, ...] = (), **props: Schema) -> Schema:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def arr(items: Schema, max_items: int | None = None, min_items: int = 0) -> Schema:
    out: Schema = {"type": "array", "items": items, "minItems": min_items}
    if max_items:
        out["maxItems"] = max_items
    return out


def enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


LABEL_SELECTOR = obj(matchLabels=STR_MAP, matchExpressions=arr(obj(
    ("key", "operator"), key=STR, operator=enum("In", "NotIn", "Exists", "DoesNotExist"), values=STRS)))
POLICY_TARGET_REF = obj(("kind", "name"), group=STR, kind=STR, name=STR, namespace=STR)
METADATA = obj(("name",), name={"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
               namespace=STR, labels=STR_MAP, annotations=STR_MAP)

PARENT_REF = obj(("name",), group=STR, kind=STR, namespace=STR, name=STR, sectionName=STR, port=PORT)
HTTP_PATH_MATCH = obj(type=enum("Exact", "PathPrefix", "RegularExpression"), value=STR)
HTTP_HEADER_MATCH = obj(("name", "value"), type=enum("Exact", "RegularExpression"), name=STR, value=STR)
HTTP_MATCH = obj(path=HTTP_PATH_MATCH, headers=arr(HTTP_HEADER_MATCH, 16),
                 queryParams=arr(HTTP_HEADER_MATCH, 16),
                 method=enum("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"))
HEADER_MOD = obj(set=arr(obj(("name", "value"), name=STR, value=STR)),
                 add=arr(obj(("name", "value"), name=STR, value=STR)), remove=STRS)
HTTP_FILTER = obj(
    ("type",),
    type=enum("RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "RequestRedirect",
              "URLRewrite", "ExtensionRef"),
    urlRewrite=obj(hostname=STR, path=obj(("type",), type=enum("ReplaceFullPath", "ReplacePrefixMatch"),
                                          replaceFullPath=STR, replacePrefixMatch=STR)),
    requestHeaderModifier=HEADER_MOD, responseHeaderModifier=HEADER_MOD,
)
BACKEND_REF = obj(("name",), group=STR, kind=STR, name=STR, namespace=STR, port=PORT,
                  weight={"type": "integer", "minimum": 0, "maximum": 1000000})

ISTIO_SOURCE = obj(**{k: STRS for k in (
    "principals", "notPrincipals", "requestPrincipals", "notRequestPrincipals", "namespaces",
    "notNamespaces", "ipBlocks", "notIpBlocks", "remoteIpBlocks", "notRemoteIpBlocks")})
ISTIO_OPERATION = obj(**{k: STRS for k in (
    "hosts", "notHosts", "ports", "notPorts", "methods", "notMethods", "paths", "notPaths")})
ISTIO_SELECTOR = obj(matchLabels=STR_MAP)


def crd(api_version: str, kind: str, spec: Schema) -> Schema:
    return obj(("apiVersion", "kind", "metadata", "spec"),
               apiVersion={"const": api_version}, kind={"const": kind}, metadata=METADATA, spec=spec)


SCHEMAS: dict[tuple[str, str], Schema] = {
    ("gateway.networking.k8s.io/v1", "Gateway"): crd("gateway.networking.k8s.io/v1", "Gateway", obj(
        ("gatewayClassName", "listeners"), gatewayClassName=STR,
        addresses=arr(obj(("value",), type=STR, value=STR)),
        listeners=arr(obj(
            ("name", "port", "protocol"), name=STR, hostname=STR, port=PORT,
            protocol=enum("HTTP", "HTTPS", "TLS", "TCP", "UDP"),
            tls=obj(mode=enum("Terminate", "Passthrough"),
                    certificateRefs=arr(obj(("name",), group=STR, kind=STR, name=STR, namespace=STR), 64),
                    options=STR_MAP),
            allowedRoutes=obj(namespaces=obj(**{"from": enum("All", "Same", "Selector")},
                                             selector=LABEL_SELECTOR),
                              kinds=arr(obj(("kind",), group=STR, kind=STR)))), 64, 1))),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): crd("gateway.networking.k8s.io/v1", "HTTPRoute", obj(
        parentRefs=arr(PARENT_REF, 32), hostnames=STRS,
        rules=arr(obj(name=STR, matches=arr(HTTP_MATCH, 64), filters=arr(HTTP_FILTER, 16),
                      backendRefs=arr(BACKEND_REF, 16),
                      timeouts=obj(request=STR, backendRequest=STR)), 16))),
    ("networking.gke.io/v1", "HealthCheckPolicy"): crd("networking.gke.io/v1", "HealthCheckPolicy", obj(
        ("default", "targetRef"), targetRef=POLICY_TARGET_REF,
        default=obj(checkIntervalSec=INT, timeoutSec=INT, healthyThreshold=INT, unhealthyThreshold=INT,
                    logConfig=obj(enabled=BOOL),
                    config=obj(("type",), type=enum("TCP", "HTTP", "HTTPS", "HTTP2", "GRPC"),
                               httpHealthCheck=obj(portSpecification=enum("USE_FIXED_PORT", "USE_NAMED_PORT",
                                                                          "USE_SERVING_PORT"),
                                                   port=PORT, portName=STR, host=STR, requestPath=STR,
                                                   response=STR, proxyHeader=enum("NONE", "PROXY_V1")))))),
    ("networking.gke.io/v1", "GCPBackendPolicy"): crd("networking.gke.io/v1", "GCPBackendPolicy", obj(
        ("default", "targetRef"), targetRef=POLICY_TARGET_REF,
        default=obj(timeoutSec={"type": "integer", "minimum": 1, "maximum": 86400},
                    connectionDraining=obj(drainingTimeoutSec=INT),
                    logging=obj(enabled=BOOL, sampleRate=INT), securityPolicy=STR,
                    sessionAffinity=obj(type=STR, cookieTtlSec=INT), maxRatePerEndpoint=INT))),
    ("security.istio.io/v1", "AuthorizationPolicy"): crd("security.istio.io/v1", "AuthorizationPolicy", obj(
        selector=ISTIO_SELECTOR, action=enum("ALLOW", "DENY", "AUDIT", "CUSTOM"),
        provider=obj(name=STR),
        rules=arr(obj(**{"from": arr(obj(source=ISTIO_SOURCE))}, to=arr(obj(operation=ISTIO_OPERATION)),
                      when=arr(obj(("key",), key=STR, values=STRS, notValues=STRS)))))),
    ("security.istio.io/v1", "RequestAuthentication"): crd("security.istio.io/v1", "RequestAuthentication", obj(
        ("jwtRules",), selector=ISTIO_SELECTOR,
        jwtRules=arr(obj(
            ("issuer",), issuer={"type": "string", "minLength": 1}, audiences=STRS, jwksUri=STR, jwks=STR,
            fromHeaders=arr(obj(("name",), name=STR, prefix=STR)), fromParams=STRS, fromCookies=STRS,
            outputPayloadToHeader=STR, forwardOriginalToken=BOOL, timeout=STR,
            outputClaimToHeaders=arr(obj(("header", "claim"), header=STR, claim=STR))), 4096, 1))),
    ("monitoring.googleapis.com/v1", "PodMonitoring"): crd("monitoring.googleapis.com/v1", "PodMonitoring", obj(
        ("selector", "endpoints"), selector=LABEL_SELECTOR, filterRunning=BOOL,
        endpoints=arr(obj(("port",), port={"type": ["string", "integer"]}, scheme=enum("http", "https"),
                          path=STR, interval={"type": "string", "pattern": r"^[0-9]+(ms|s|m|h)$"},
                          timeout=STR), min_items=1),
        targetLabels=obj(fromPod=arr(obj(("from",), **{"from": STR}, to=STR)), metadata=STRS))),
    ("cloud.google.com/v1", "ComputeClass"): crd("cloud.google.com/v1", "ComputeClass", obj(
        ("priorities",), description=STR,
        priorities=arr(obj(machineFamily=STR, machineType=STR, nodepools=STRS, spot=BOOL, minCores=INT,
                           minMemoryGb=INT, gpu=obj(type=STR, count=INT, driverVersion=STR)), min_items=1),
        activeMigration=obj(optimizeRulePriority=BOOL),
        nodePoolAutoCreation=obj(enabled=BOOL),
        whenUnsatisfiable=enum("ScaleUpAnyway", "DoNotScaleUp"))),
    ("secrets-store.csi.x-k8s.io/v1", "SecretProviderClass"): crd(
        "secrets-store.csi.x-k8s.io/v1", "SecretProviderClass",
        obj(("provider",), provider=STR, parameters=STR_MAP, secretObjects=arr({"type": "object"}))),
}
