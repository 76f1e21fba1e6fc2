"""The extension's gRPC server: ext_proc on EXT_PROC_PORT over TLS (the load balancer speaks
HTTP/2 to its callout backends over TLS and verifies no certificate, so a self-signed one made at
start serves, as GKE's body-based router and endpoint picker do: their --secure-serving), and the
gRPC health service in the clear on HEALTH_PORT for the load balancer's health check and the
kubelet's probes. On SIGTERM it reports NOT_SERVING, keeps answering for DRAIN_S (the load
balancer stops sending), then stops."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import signal
from typing import Optional

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import add_ExternalProcessorServicer_to_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # pyright: ignore[reportAttributeAccessIssue] (set at import, no stub)

from .config import Config, load
from .processor import IdentityProcessor

EXT_PROC_PORT = int(os.environ.get("EXT_PROC_PORT", "9004"))
HEALTH_PORT = int(os.environ.get("HEALTH_PORT", "9005"))
DRAIN_S = float(os.environ.get("DRAIN_S", "15"))
log = logging.getLogger("vllm_gke_identity")


def self_signed(host: str = "vllm-gke-identity") -> tuple[bytes, bytes]:
    """A fresh key and a certificate for it (PEM), valid a year."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()), cert.public_bytes(serialization.Encoding.PEM))


async def serve(config: Config, ext_proc_port: int = EXT_PROC_PORT, health_port: int = HEALTH_PORT,
                tls: bool = True, stop: Optional[asyncio.Event] = None, drain_s: float = DRAIN_S) -> None:
    """Serve until `stop` is set (SIGTERM or SIGINT when None), then drain for `drain_s`."""
    server, checks = grpc.aio.server(), grpc.aio.server()
    add_ExternalProcessorServicer_to_server(IdentityProcessor(config), server)
    status = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, checks)
    address = f"[::]:{ext_proc_port}"
    if tls:
        server.add_secure_port(address, grpc.ssl_server_credentials([self_signed()]))
    else:
        server.add_insecure_port(address)
    checks.add_insecure_port(f"[::]:{health_port}")
    await server.start()
    await checks.start()
    await status.set("", health_pb2.HealthCheckResponse.SERVING)
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await status.enter_graceful_shutdown()
    await asyncio.sleep(drain_s)
    await server.stop(drain_s)
    await checks.stop(0)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load()
    except (KeyError, ValueError, OSError, TypeError) as err:
        log.error("IDENTITY_CONFIG: %s", err)
        raise SystemExit(2) from err
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
