"""The upstream CRD files the plan validates custom resources against, pinned: where each comes from
(repository, tag or branch, commit, path) and the sha256 of its bytes.

The names are those of ../shared/upstream-crds (SOURCES.md there says where each file came from;
tests/test_crd_sources.py holds these pins to it and to the files' bytes). infra/crd_cache.py
fetches them into a user's cache, each checked against its sha256, so a plan checks the same
schemas on any machine. Only the files that define a kind some component emits are pinned
(`NOT_FETCHED` lists the rest of the shared folder and why).

Three kinds of file:
- `Fetched`: a plain file of a public repository, taken unchanged from raw.githubusercontent.com at
  its tag (or, for a branch's or datree's file, at the commit that holds it).
- `HelmRendered`: a Helm chart's CRD template (KEDA's: the chart is what installs KEDA) rendered as
  ../shared/upstream-crds' file was by hand: the `{{- ... }}` lines (optional annotations and
  labels) dropped and `{{ .Values.operator.name }}` set to its default. The rendered bytes are
  pinned: the same as the shared file's.
- `BuiltFromDump`: a CRD around a GKE cluster's schema dump from datreeio/CRDs-catalog (GKE
  publishes no CRD source for ComputeClass, its Gateway policies or GCPDataSource):
  `additionalProperties: false` (which a structural schema may not hold; the server prunes instead)
  dropped, apiVersion/kind/metadata declared, a status subresource. Written as JSON (which YAML
  reads the same) so its bytes, and so its pin, do not depend on the YAML library's formatting. The
  hand-built shared file holds the same CRD (tests/test_crd_sources.py compares them), not the
  same bytes. Built in code rather than shipped: the dump is datree's (MIT) of Google's schema, and
  a derivation anyone can rerun says exactly what was changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

RAW = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class Fetched:
    name: str  # the file's name in the CRD folder (as in ../shared/upstream-crds)
    repo: str  # owner/name on GitHub
    path: str  # in the repository
    commit: str  # the full commit the tag (or the branch, when pinned) names
    sha256: str  # of the file's bytes
    tag: Optional[str] = None  # the release tag, when the file is a release's
    branch: Optional[str] = None  # the branch SOURCES.md names (main, master) for a file taken at a commit of it

    @property
    def url(self) -> str:
        """At the tag when there is one (a tag that moved fails the sha256), else at the commit."""
        return f"{RAW}/{self.repo}/{self.tag or self.commit}/{self.path}"


@dataclass(frozen=True)
class HelmRendered:
    name: str
    template: Fetched  # the chart's template (its name: the template's file name, never in the folder)
    sha256: str  # of the rendered bytes


@dataclass(frozen=True)
class BuiltFromDump:
    name: str
    dump: str  # the Fetched datree-<group>_<kind>_<version>.json it is built from
    kind: str  # the dump's file name has it in lower case only
    plural: str
    scope: str  # Namespaced or Cluster: a dump holds only the schema
    sha256: str  # of the built bytes


Pin = Union[Fetched, HelmRendered, BuiltFromDump]


def _gwapi(name: str, ref: str, commit: str, plural: str, sha256: str, *, branch: bool = False) -> Fetched:
    return Fetched(name, "kubernetes-sigs/gateway-api", f"config/crd/standard/gateway.networking.k8s.io_{plural}.yaml",
                   commit, sha256, tag=None if branch else ref, branch=ref if branch else None)


def _datree(group: str, kind: str, commit: str, sha256: str) -> Fetched:
    return Fetched(f"datree-{group}_{kind}_v1.json", "datreeio/CRDs-catalog", f"{group}/{kind}_v1.json", commit, sha256)


ISTIO = "kubernetes/customresourcedefinitions.gen.yaml"
GMP = "charts/operator/crds/monitoring.googleapis.com_podmonitorings.yaml"
SSCSI = "deploy/secrets-store.csi.x-k8s.io_secretproviderclasses.yaml"
GIE = "kubernetes-sigs/gateway-api-inference-extension"
KEDA_CHARTS = "kedacore/charts"
LLMD = "llm-d/llm-d-router"
LLMD_COMMIT = "71f4f0999f95b96c49a9d0c4afbd18dfdb943c26"

# Gateway API (release v1.6.1, v1.2.1 as GKE's managed Gateway API long shipped, and main).
GATEWAY_API = (
    _gwapi("gwapi-v1.6.1-gateways.yaml", "v1.6.1", "8bb74df00e56ec8f944d48c25e6c1c9c2f6848e3", "gateways",
           "25b885f5870b8fff1ae82efa2628b2761cef3745900c2aecf8fb76629a01255a"),
    _gwapi("gwapi-v1.6.1-httproutes.yaml", "v1.6.1", "8bb74df00e56ec8f944d48c25e6c1c9c2f6848e3", "httproutes",
           "a424a0d6c953b162e71d1d97bb7e75012d8f1ac264e7274f2763d1b96ab39852"),
    _gwapi("gwapi-v1.2.1-gateways.yaml", "v1.2.1", "a8fe5c8732a37ef471d86afaf570ff8ad0ef0221", "gateways",
           "9aea7ae080dfe9c25a814d3d14eed28f335d28de3cbdc00a0351e0e99cb3bf06"),
    _gwapi("gwapi-v1.2.1-httproutes.yaml", "v1.2.1", "a8fe5c8732a37ef471d86afaf570ff8ad0ef0221", "httproutes",
           "db36230a2f54ca3f1733bebc9d303d4db16c958856bf2be941a2c6269b872014"),
    _gwapi("gwapi-HEAD-gateways.yaml", "main", "4564255ac2c35d582249b3cdf261bdf51c8bca32", "gateways",
           "161791d534b1ef582573cad99f9163eb8761715e6e934dd93374a5999ad17356", branch=True),
    _gwapi("gwapi-HEAD-httproutes.yaml", "main", "4564255ac2c35d582249b3cdf261bdf51c8bca32", "httproutes",
           "5b746e5dd696239cdf7d1a6dc6293d103fb78056598aa3f2e14f7512dc8c362b", branch=True),
)

ISTIO_API = (
    Fetched("istio-1.30.3-crds.yaml", "istio/api", ISTIO, "2e43f07b30b6744bc8252fce39fb58b03f85ff8b",
            "dcb43ff6b9af2f629b80b6a82597f5a91db259c757e66cc5353ac007da28351a", tag="1.30.3"),
    Fetched("istio-1.24.6-crds.yaml", "istio/api", ISTIO, "4933c1da972e2dbb2c63706d2d77076280f95860",
            "60c3309cac9c9b1ac9b67aa441a0eb6333c8b2d4132597cf907c206f2a4f1ffe", tag="1.24.6"),
    Fetched("istio-HEAD-crds.yaml", "istio/api", ISTIO, "b8f8791d9653b2edc77a071d48887e582cfe84bf",
            "c98c49e3435f7ca04938cc710f929bbfe952472b177c3a7384b31e383c6b6c7a", branch="master"),
)

GKE_AND_CSI = (
    Fetched("gmp-v0.17.2-podmonitorings.yaml", "GoogleCloudPlatform/prometheus-engine", GMP,
            "7920a2a222af1c09535d8141684e2944670c5041",
            "d344029bc7754e0254d7c253db9d6400b344d5837e121b42790946757bc79f1f", tag="v0.17.2"),
    Fetched("gmp-HEAD-podmonitorings.yaml", "GoogleCloudPlatform/prometheus-engine", GMP,
            "2ffde4ec7b7e4ca1da4e32f36b692945b78a60e4",
            "e14f6b033dae70890e27d69943dc1b6c0874ad0db73425483e2e4a65597d2e19", branch="main"),
    Fetched("gkegw-HEAD-gcpbackendpolicies.yaml", "GoogleCloudPlatform/gke-gateway-api",
            "config/crd/networking.gke.io_gcpbackendpolicies.yaml", "fc40d606a5332f11a8883f85caff66b63c4e88ef",
            "e696e138973d42ca54326403850c4518875053e5e8cf5238128bfc5ce5663668", branch="main"),
    Fetched("gkegw-HEAD-healthcheckpolicies.yaml", "GoogleCloudPlatform/gke-gateway-api",
            "config/crd/networking.gke.io_healthcheckpolicies.yaml", "fc40d606a5332f11a8883f85caff66b63c4e88ef",
            "94ea8b54cabad1e7c67f518de7394149e6ffb6b80ac2f8523650e3e70f6a9c94", branch="main"),
    Fetched("sscsi-v1.6.0-spc.yaml", "kubernetes-sigs/secrets-store-csi-driver", SSCSI,
            "4960f9637c51ad9cb9ef264481bc6d9a98bf1f1c",
            "ef1623b34403bb11311fc92763b5b364ba456a166f1637eeec8d29052dd115f3", tag="v1.6.0"),
    Fetched("sscsi-HEAD-spc.yaml", "kubernetes-sigs/secrets-store-csi-driver", SSCSI,
            "0aad886f70e94a6037325f4eaba4660338dde448",
            "ef1623b34403bb11311fc92763b5b364ba456a166f1637eeec8d29052dd115f3", branch="main"),
)

INFERENCE_AND_LWS = (
    Fetched("gie-v1.2.0-inferenceobjectives.yaml", GIE,
            "config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml",
            "52ed3abfd4aa2374cc0f4ab5abe94675eb35311c",
            "499f80fe3b7d9a8be54e454f1d9e7defb90adbf679167039e7f6df611f3c97f5", tag="v1.2.0"),
    Fetched("gie-v1.2.0-inferencepools.yaml", GIE, "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
            "52ed3abfd4aa2374cc0f4ab5abe94675eb35311c",
            "87d5eb89eabd776a1936b0df8e6c144e086d743374bd91c6b865cfb28dbd6b60", tag="v1.2.0"),
    Fetched("gie-v1.5.0-inferencepools.yaml", GIE, "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
            "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849",
            "0bc3ddd94db6f588a5cecc627c39e3d12b4343d51c48d47ffa68c50fa73c290c", tag="v1.5.0"),
    # llm-d-router v0.10.0's own kinds (group llm-d.ai): what its endpoint picker reads.
    Fetched("llmd-router-v0.10.0-inferenceobjectives.yaml", LLMD, "config/crd/bases/llm-d.ai_inferenceobjectives.yaml",
            LLMD_COMMIT, "c1e763412fcbe2b55e9282850156269a10053be2d052547cb80a2ca639c09990", tag="v0.10.0"),
    Fetched("llmd-router-v0.10.0-inferencemodelrewrites.yaml", LLMD,
            "config/crd/bases/llm-d.ai_inferencemodelrewrites.yaml", LLMD_COMMIT,
            "62a07fff40e10e919c245d895457a9c15be22947b45f06815552ae8fffaab405", tag="v0.10.0"),
    Fetched("lws-v0.10.0-leaderworkersets.yaml", "kubernetes-sigs/lws",
            "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml", "2161f38ff333f9e24d3c44adef7cd5d9787cac00",
            "c5dcad8ed943e495490241f00b9a1b45d51203b6d484020db3636d5bf553568e", tag="v0.10.0"),
)

# Flagger's Canary, MetricTemplate and AlertProvider (the chart's crds/crd.yaml is the same file).
FLAGGER = (
    Fetched("flagger-v1.44.0-crds.yaml", "fluxcd/flagger", "artifacts/flagger/crd.yaml",
            "15bd6ad555e6c935da55f0ab95977be74c149bd6",
            "8d7ad05c2d1d242c0cd4c25c5fb3ad0f75f10706da588aeeb950fe2858134630", tag="v1.44.0"),
)

# GKE cluster dumps (openAPIV3Schema as GKE 1.33 installs it), each at the commit that added it.
DATREE = (
    _datree("cloud.google.com", "computeclass", "77e49833da1a723ff2f1ec34251c5eafc8c75daa",
            "8f8aa0f0b68ce40059deab247089440eafc6e475f1edc1b1dfec30e27cd2c632"),
    _datree("datalayer.gke.io", "gcpdatasource", "bc448ef449eb3a713bbd8bfe5a22bd5d5c902b01",
            "4716eff58647ac4e9d8953bc4db0e456b7f325d2ed190f0a97cad8525edc3b98"),
    _datree("gateway.networking.k8s.io", "gateway", "041baf4c1d3740ca21461cab765e7432ecd073ef",
            "85575b3a7d79416f8b09658cf6a3f9a6b79544bbf10c4c465c78bdaab1ea0364"),
    _datree("gateway.networking.k8s.io", "httproute", "041baf4c1d3740ca21461cab765e7432ecd073ef",
            "e5692e62edd9b8a14bd2527d0a732e174a649131aa4d47159737dc6527c59ca5"),
    _datree("monitoring.googleapis.com", "podmonitoring", "9381fb9e9ff658f05b77f24955c72cc77dde38a1",
            "974766cd8d9c3f1fe21fb2012a16268afaf5a060c4f6cc0fdabacba261ffe331"),
    _datree("networking.gke.io", "gcpbackendpolicy", "bb634203d310949897465529ee076fa9405232b4",
            "4bb2e81acc26055b2a55472940a30c09f32dbf065a6174fa7e71ff9bd20f4ba0"),
    _datree("networking.gke.io", "healthcheckpolicy", "bb634203d310949897465529ee076fa9405232b4",
            "a78437ed95d100b202896c8fdd4bac80f5bcd3282d876fcbce39dc0a68cbc6ed"),
    _datree("secrets-store.csi.x-k8s.io", "secretproviderclass", "49754c43431da67e872ad9735b330859b2befb99",
            "d1f04289075c27ec454c66bc7559d2100ebe49ef85753bd852efc66646b6fa2f"),
    _datree("security.istio.io", "authorizationpolicy", "940ccedb754b40dc76eb8b728182640a87daaee4",
            "fbcb75e9ef6cd0f8ca184c16dea7a29f540cb8b883012770b25e79f1357967b0"),
    _datree("security.istio.io", "requestauthentication", "940ccedb754b40dc76eb8b728182640a87daaee4",
            "2c58b53c10ee174d968567cb544dc548fcd6f1674ccc85dbb507d6681667b0e2"),
)

FETCHED: tuple[Fetched, ...] = GATEWAY_API + ISTIO_API + GKE_AND_CSI + INFERENCE_AND_LWS + FLAGGER + DATREE


def _keda(plural: str, template_sha256: str, sha256: str) -> HelmRendered:
    template = Fetched(f"crd-{plural}.yaml", KEDA_CHARTS, f"keda/templates/crds/crd-{plural}.yaml",
                       "cbb9bb8ce0809dc9048f72302f7c09765d66ed56", template_sha256, tag="v2.20.2")
    return HelmRendered(f"keda-chart-v2.20.2-{plural}.yaml", template, sha256)


HELM_RENDERED: tuple[HelmRendered, ...] = (
    _keda("scaledobjects", "c597a1692044588f34d2f558c68b37e4db3e8f0a930ce6dc0397feb777473808",
          "56640e0819192f05373a57f651d7a30bb7170ca73c5ac164c5f5b22ddac7901c"),
    _keda("clustertriggerauthentications", "7beb3604d403e40c1baeba653f69a825a5113138824b96d83a1236ca28d18b9d",
          "503963e27fd4d0f01c1df5abd0a62c34bec618b2511aa21b12587e49ab029776"),
)

BUILT_FROM_DUMPS: tuple[BuiltFromDump, ...] = (
    BuiltFromDump("gke-computeclass-v1-from-datree-77e4983.yaml", "datree-cloud.google.com_computeclass_v1.json",
                  "ComputeClass", "computeclasses", "Cluster",
                  "f0751f98208b7ba35aa754d22abccd286be5be7065bab6fd5567247ed376a232"),
    BuiltFromDump("gke-gcpbackendpolicy-v1-from-datree-bb63420.yaml",
                  "datree-networking.gke.io_gcpbackendpolicy_v1.json",
                  "GCPBackendPolicy", "gcpbackendpolicies", "Namespaced",
                  "8693539fbe23282e6f1fad4782fc5b6383598185ca41b014c1b9e1d070cd49c9"),
    BuiltFromDump("gke-healthcheckpolicy-v1-from-datree-bb63420.yaml",
                  "datree-networking.gke.io_healthcheckpolicy_v1.json",
                  "HealthCheckPolicy", "healthcheckpolicies", "Namespaced",
                  "17dbc59cbd7b60ca42716f71c1a317e3177b62e7d7c8ebbff3d0519f98de4728"),
    BuiltFromDump("gke-gcpdatasource-v1-from-datree-bc448ef.yaml", "datree-datalayer.gke.io_gcpdatasource_v1.json",
                  "GCPDataSource", "gcpdatasources", "Namespaced",
                  "7584306e72c245e03b32ccd9454d390371a4e80674a7563306094a04af1c228c"),
)

PINS: tuple[Pin, ...] = FETCHED + HELM_RENDERED + BUILT_FROM_DUMPS

# The rest of ../shared/upstream-crds: kinds no component emits, so the plan needs no CRD for them.
NOT_FETCHED: dict[str, str] = {}
