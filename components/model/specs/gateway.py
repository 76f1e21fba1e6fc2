"""The Gateway: class, hostname and TLS, timeouts."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import (
    Field,
    model_validator,
)

from .base import (
    Hostname,
    K8sName,
    Spec,
)


class GatewaySpec(Spec):
    # Internal by default: exposing models to the internet is a decision, with TLS required.
    class_name: Literal[
        "gke-l7-regional-external-managed", "gke-l7-rilb", "gke-l7-global-external-managed"
    ] = "gke-l7-rilb"
    # The DNS name clients use (required for a managed certificate).
    hostname: Optional[Hostname] = None
    # TLS from an existing kubernetes.io/tls Secret in the serving namespace...
    tls_secret_name: Optional[K8sName] = None
    # ...or a Google-managed Certificate Manager certificate for `hostname` (DNS authorization:
    # create the CNAME record the stack exports as `dnsAuthorization`).
    managed_certificate: bool = False
    # Reserve the load balancer's address, so DNS records survive a re-created Gateway.
    static_ip: bool = True
    # Backend timeout; long generations stream for minutes.
    request_timeout_seconds: int = Field(default=600, ge=30, le=3600)

    @property
    def external(self) -> bool:
        return self.class_name != "gke-l7-rilb"

    @property
    def regional(self) -> bool:
        return self.class_name != "gke-l7-global-external-managed"

    @property
    def tls(self) -> bool:
        return bool(self.tls_secret_name or self.managed_certificate)

    @model_validator(mode="after")
    def _tls(self) -> "GatewaySpec":
        if self.tls_secret_name and self.managed_certificate:
            raise ValueError("set either tlsSecretName or managedCertificate, not both")
        if self.managed_certificate and not self.hostname:
            raise ValueError("managedCertificate needs a hostname to issue the certificate for")
        if self.external and not self.tls:
            raise ValueError(
                f"an external gateway ({self.class_name}) serves HTTPS only, so bearer tokens never cross "
                "the internet in clear: set managedCertificate: true (with hostname) or tlsSecretName")
        return self
