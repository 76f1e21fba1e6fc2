"""The building blocks of every spec: the Spec base (camelCase keys, no unknown keys), the
validated scalar types (names, CIDRs, revisions, hostnames) and the image reference."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Callable, Optional, TypeGuard

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError(
            f"'{value}' is not a valid name; use 1-32 lowercase letters, digits or '-', "
            "starting with a letter (it becomes Kubernetes and GCP resource names)"
        )
    return value


Name = Annotated[str, AfterValidator(_dns_label)]


def _utc_time(value: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", value):
        raise ValueError(f"'{value}' must be an RFC 3339 UTC time like 2026-01-03T02:00:00Z")
    return value


UtcTime = Annotated[str, AfterValidator(_utc_time)]

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
HOSTNAME = re.compile(r"^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z][-a-z0-9]{0,61}[a-z0-9]$")
_EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,}$")
# A Docker tag; digests are checked separately.
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPOSITORY = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$")
# A git branch, tag, commit or Hugging Face ref (refs/pr/1); never a path out of the model's folder.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
# What a credential looks like: a Hugging Face token, or a long run of key-like characters.
TOKEN_LIKE = re.compile(r"^(hf_[A-Za-z0-9]{20,}|[A-Za-z0-9+/_=-]{40,})$")


def gke_version(value: str) -> Optional[tuple[int, int, int, int]]:
    """(major, minor, patch, gke.N) of a GKE version or alias; a missing part reads as the newest
    (the alias picks the highest), so comparisons ask "can this alias resolve below the minimum"
    only for what is spelled out. None if it is not a version."""
    m = re.fullmatch(r"1\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?", value)
    if not m:
        return None
    big = 10**9
    return (1, int(m[1]), int(m[2]) if m[2] is not None else big, int(m[3]) if m[3] is not None else big)


def _k8s_name(value: str) -> str:
    if len(value) > 253 or not _K8S_NAME.match(value):
        raise ValueError(f"'{value}' is not a Kubernetes object name: use lowercase letters, digits, '-' "
                         "and '.', starting and ending with a letter or digit")
    return value


def _hostname(value: str) -> str:
    if len(value) > 253 or not HOSTNAME.match(value):
        raise ValueError(f"'{value}' is not a DNS hostname like llm.example.com (lowercase, optionally '*.' first)")
    return value


def _email(value: str) -> str:
    if not _EMAIL.match(value):
        raise ValueError(f"'{value}' is not an e-mail address like oncall@example.com")
    return value


def cidr_range(hint: int, smallest: int = 32, why: str = "") -> Callable[[str], str]:
    """A validator of an IPv4 range: a bare address is refused (ip_network would read it as a
    /32) with the range it probably means (`hint` its prefix), set host bits with the range they
    belong to, and a range smaller than a /`smallest` with `why`."""

    def check(value: str) -> str:
        if "/" not in value:
            try:
                address = ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"'{value}' is not an IPv4 range like 10.0.0.0/{hint}") from None
            if address.version == 4:
                raise ValueError(f"'{value}' has no prefix length; write the range, like "
                                 f"{ipaddress.ip_network(f'{value}/{hint}', strict=False)}")
        try:
            network = ipaddress.ip_network(value, strict=True)
        except ValueError:
            try:
                meant = ipaddress.ip_network(value, strict=False)
            except ValueError:
                raise ValueError(f"'{value}' is not an IPv4 range like 10.0.0.0/{hint}") from None
            raise ValueError(f"'{value}' has address bits past its prefix; the range is {meant}") from None
        if network.version != 4:
            raise ValueError(f"'{value}' is IPv6: these ranges are IPv4 (like 10.0.0.0/{hint})")
        if network.prefixlen > smallest:
            raise ValueError(f"'{value}' is too small: a /{smallest} at least{why}")
        return value

    return check


def _git_revision(value: str) -> str:
    if len(value) > 255 or not _REVISION.fullmatch(value) or ".." in value or value.endswith((".lock", "/", ".")):
        raise ValueError(f"revision '{value}' is not a git branch, tag or commit (like main, v1.0, a 40-character "
                         "sha or refs/pr/1)")
    return value


K8sName = Annotated[str, AfterValidator(_k8s_name)]
Revision = Annotated[str, AfterValidator(_git_revision)]


def weights_source(v: str) -> str:
    """A model's, an adapter's or a draft's source: hf://<org>/<repo> or gs://<bucket>/<path>."""
    hf = r"hf://[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
    gs = r"gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[A-Za-z0-9._-]+)*/?"
    if not re.fullmatch(f"({hf}|{gs})", v) or "/../" in v + "/" or "/./" in v + "/":
        raise ValueError(f"source '{v}' must be hf://<org>/<repo> or gs://<bucket>/<path> (letters, digits, "
                         "'.', '_', '-'; no '..' segments)")
    return v


WeightsSource = Annotated[str, AfterValidator(weights_source)]
Hostname = Annotated[str, AfterValidator(_hostname)]
Email = Annotated[str, AfterValidator(_email)]
Cidr = Annotated[str, AfterValidator(cidr_range(32))]
SubnetCidr = Annotated[str, AfterValidator(cidr_range(20, 29, " (GKE's smallest node subnet)"))]
PodsCidr = Annotated[str, AfterValidator(cidr_range(14, 21, ": each node takes a /24 of it, so a /21 is 8 nodes"))]
ServicesCidr = Annotated[str, AfterValidator(cidr_range(20, 27, " (GKE's smallest services range)"))]
MasterCidr = Annotated[str, AfterValidator(cidr_range(28))]
ProxyOnlyCidr = Annotated[str, AfterValidator(cidr_range(23, 26, " (Google's smallest proxy-only subnet)"))]


class Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def max_replicas_over_min(v: int, info: ValidationInfo) -> int:
    """A pool's maxReplicas, refused below its minReplicas (every pool spec's field validator)."""
    low = info.data.get("min_replicas", 1)
    if low > v:
        raise ValueError(f"maxReplicas ({v}) is below minReplicas ({low}); raise maxReplicas")
    return v


def config_mapping(value: Any) -> TypeGuard[dict[str, Any]]:
    """Raw config data that is a mapping (YAML's and the packages' keys are strings)."""
    return isinstance(value, dict)


def item_key(field: str, items: Any, i: int) -> str:
    """The config key of a list's i-th item as the stack file reads it, by its name
    ('models[qwen-7b]'); by index ('models[0]') where it has no name or its list repeats the name
    (the repeat itself is reported on its own)."""
    name = getattr(items[i], "name", None)
    unique = isinstance(name, str) and name and sum(getattr(x, "name", None) == name for x in items) == 1
    return f"{field}[{name}]" if unique else f"{field}[{i}]"


class ImageRef(Spec):
    # Image repository, without tag or digest (e.g. us-central1-docker.pkg.dev/proj/repo/vllm-server).
    repository: str
    # Image tag: a release, never latest (tag or digest is required).
    tag: Optional[str] = None
    # Image digest, sha256:<64 hex>; pins the image exactly.
    digest: Optional[str] = None

    @field_validator("repository")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _REPOSITORY.match(v):
            raise ValueError(f"'{v}' is not an image repository like us-central1-docker.pkg.dev/proj/repo/name "
                             "(no tag or digest here: use `tag` or `digest`)")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _TAG.match(v):
            raise ValueError(f"tag '{v}' is not a Docker tag: 1-128 of letters, digits, '_', '.', '-', "
                             "not starting with '.' or '-'")
        return v

    @model_validator(mode="after")
    def _pinned(self) -> "ImageRef":
        if self.digest is None and (self.tag is None or self.tag == "latest"):
            raise ValueError(
                "image must be pinned; set `tag` to a release (not 'latest') or `digest` to sha256:..."
            )
        if self.digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", self.digest):
            raise ValueError("digest must look like sha256:<64 hex chars>")
        return self

    @property
    def uri(self) -> str:
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"
