"""The pinned upstream CRDs (infra/crd_sources.py) are the files of ../shared/upstream-crds: each
pin's sha256 is the shared file's, and its URL names the repository, tag (or branch and commit) and
path that the folder's SOURCES.md gives for it; the files built in code hold the same CRD as the
hand-built shared ones. Skip where the shared folder is absent, as the other CRD tests do."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import STACKS
from vllm_gke.infra.crd_cache import build_from_dump, fill, missing
from vllm_gke.infra.crd_sources import (
    BUILT_FROM_DUMPS,
    FETCHED,
    HELM_RENDERED,
    NOT_FETCHED,
    PINS,
    RAW,
    BuiltFromDump,
    Fetched,
    HelmRendered,
    Pin,
)
from vllm_gke.infra.crd_validation import DEFAULT_CRD_DIR
from vllm_gke.infra.manifests import is_builtin, unpublished

SHARED = DEFAULT_CRD_DIR
pytestmark = pytest.mark.skipif(not (SHARED / "SOURCES.md").is_file(),
                                reason=f"no {SHARED}: the pins are checked against the shared upstream CRDs where it is")


@dataclass(frozen=True)
class Origin:
    """One file's row of SOURCES.md: repository @ ref (commit) : path, or how it was built (repo None)."""
    text: str
    repo: Optional[str] = None
    ref: Optional[str] = None  # a tag or a branch
    commit: Optional[str] = None  # abbreviated, as SOURCES.md writes it
    path: Optional[str] = None


BRACES = re.compile(r"\{([^}]*)\}")
ORIGIN = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)(?:\s*@\s*(?P<refs>[^:]+?))?\s*:\s*(?P<path>\S+)")
HEX = re.compile(r"[0-9a-f]{7,40}")


def _expand(text: str) -> list[str]:
    m = BRACES.search(text)
    return [text[:m.start()] + alt + text[m.end():] for alt in m.group(1).split(",")] if m else [text]


def _ref(text: str) -> tuple[Optional[str], Optional[str]]:
    """'v1.2.0 (52ed3ab)' -> (tag, commit); 'main (2026)' -> ('main', None); 'bc448ef' -> (None, commit)."""
    m = re.fullmatch(r"(\S+)(?:\s*\((.*)\))?", text.strip())
    assert m, text
    if HEX.fullmatch(m.group(1)):
        return None, m.group(1)
    return m.group(1), (m.group(2) if m.group(2) and HEX.fullmatch(m.group(2)) else None)


def _row_origins(names_cell: str, origin: str, last_path: Optional[str]) -> tuple[dict[str, Origin], Optional[str]]:
    names = [n for part in names_cell.split(", ") for n in _expand(part)]
    m = ORIGIN.match(origin)
    if m is None:
        return {n: Origin(origin) for n in names}, last_path
    path = m["path"].rstrip(",;")
    path = last_path if path == "same" and last_path else path  # "same paths" as the row above
    alts = BRACES.search(names_cell)
    if BRACES.search(path):
        paths = _expand(path)
    elif "*" in path and alts:
        paths = [path.replace("*", alt) for alt in alts.group(1).split(",")]
    else:
        paths = [path] * len(names)
    refs = [_ref(r) for r in m["refs"].split(" / ")] if m["refs"] else [(None, None)]
    refs = refs * len(names) if len(refs) == 1 else refs
    assert len(paths) == len(names) == len(refs), origin
    return {n: Origin(origin, m["repo"], r, c, p) for n, p, (r, c) in zip(names, paths, refs)}, path


def sources_md(text: str) -> dict[str, Origin]:
    """Every file (or glob) SOURCES.md's tables name, with its origin."""
    out: dict[str, Origin] = {}
    last_path: Optional[str] = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or cells[0] in ("file", "---"):
            continue
        rows, last_path = _row_origins(cells[0].replace("`", ""), cells[1], last_path)
        out.update(rows)
    return out


def origin_of(name: str, origins: dict[str, Origin]) -> Optional[Origin]:
    """The file's own row, else a glob row's (datree-*.json: <group>/<kind>_v1.json)."""
    if name in origins:
        return origins[name]
    for pattern, origin in origins.items():
        if fnmatch.fnmatch(name, pattern) and origin.path:
            group, kind, _version = name.removeprefix("datree-").removesuffix(".json").rsplit("_", 2)
            return dataclasses.replace(origin, path=origin.path.replace("<group>", group).replace("<kind>", kind))
    return None


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def url_problems(pin: Fetched, origin: Origin) -> list[str]:
    """The URL against SOURCES.md's repository, ref (and commit) and path."""
    parts = urlsplit(pin.url)
    owner, repo, ref, path = (parts.path.split("/", 4)[1:] + ["", "", "", ""])[:4]
    out = []
    if f"{parts.scheme}://{parts.netloc}" != RAW:
        out.append(f"{pin.url}: not a {RAW} URL")
    if f"{owner}/{repo}" != origin.repo:
        out.append(f"{pin.url}: repository {owner}/{repo}, SOURCES.md says {origin.repo}")
    if path != origin.path:
        out.append(f"{pin.url}: path {path}, SOURCES.md says {origin.path}")
    if origin.commit and not pin.commit.startswith(origin.commit):
        out.append(f"{pin.name}: commit {pin.commit}, SOURCES.md says {origin.commit}")
    if origin.ref and pin.tag is None and pin.branch != origin.ref:  # a branch's file, taken at a commit of it
        out.append(f"{pin.name}: branch {pin.branch}, SOURCES.md says {origin.ref}")
    expected_ref = pin.commit if pin.tag is None else origin.ref
    if ref != expected_ref or not (pin.tag or (HEX.fullmatch(ref) and len(ref) == 40)):
        out.append(f"{pin.url}: at {ref}, SOURCES.md says {origin.ref or origin.commit} (a tag, or a full commit)")
    return out


def built_problems(pin: BuiltFromDump, origin: Origin) -> list[str]:
    """Built as SOURCES.md says, from a pinned dump; the same CRD as the hand-built shared file."""
    dumps = {p.name: p for p in FETCHED}
    group = pin.dump.removeprefix("datree-").split("_")[0]
    abbrev = pin.name.removesuffix(".yaml").rsplit("-from-datree-", 1)[-1]
    out = []
    if origin.repo is not None or "built from" not in origin.text or group not in origin.text:
        out.append(f"{pin.name}: SOURCES.md does not say it is built from the {group} dump ({origin.text[:80]})")
    if pin.dump not in dumps or not dumps[pin.dump].commit.startswith(abbrev):
        out.append(f"{pin.name}: built from {pin.dump}, which is not pinned at datree's {abbrev}")
        return out
    built = build_from_dump(pin, (SHARED / pin.dump).read_text())
    if hashlib.sha256(built).hexdigest() != pin.sha256:
        out.append(f"{pin.name}: built with sha256 {hashlib.sha256(built).hexdigest()}, pinned {pin.sha256}")
    if yaml.safe_load(built) != json.loads(built):
        out.append(f"{pin.name}: YAML reads the built JSON otherwise")
    shared = yaml.safe_load((SHARED / pin.name).read_text())
    if (yaml.safe_load(built)["spec"], yaml.safe_load(built)["metadata"]["name"]) != (shared["spec"], shared["metadata"]["name"]):
        out.append(f"{pin.name}: the built CRD differs from the shared file's")
    return out


def pin_problems(pin: Pin, origins: dict[str, Origin]) -> list[str]:
    origin = origin_of(pin.name, origins)
    if origin is None:
        return [f"{pin.name}: not in SOURCES.md"]
    if isinstance(pin, BuiltFromDump):
        return built_problems(pin, origin)
    out = [] if sha256_of(SHARED / pin.name) == pin.sha256 else \
        [f"{pin.name}: pinned sha256 {pin.sha256}, the shared file's is {sha256_of(SHARED / pin.name)}"]
    if isinstance(pin, HelmRendered):
        out += [] if "rendered" in origin.text else [f"{pin.name}: SOURCES.md does not say it is rendered"]
        return out + url_problems(pin.template, origin)
    return out + url_problems(pin, origin)


@pytest.fixture(scope="module")
def origins() -> dict[str, Origin]:
    return sources_md((SHARED / "SOURCES.md").read_text())


def test_sources_md_reads_as_expected(origins):
    """The parser itself, on rows of each shape (so a pin's check cannot pass for want of a row)."""
    assert origins["istio-1.24.6-crds.yaml"] == Origin(
        origins["istio-1.24.6-crds.yaml"].text, "istio/api", "1.24.6", None, "kubernetes/customresourcedefinitions.gen.yaml")
    assert origins["gwapi-v1.2.1-httproutes.yaml"].path == "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"
    assert origins["gkegw-HEAD-healthcheckpolicies.yaml"].path == "config/crd/networking.gke.io_healthcheckpolicies.yaml"
    assert (origins["lws-v0.10.0-leaderworkersets.yaml"].ref, origins["lws-v0.10.0-leaderworkersets.yaml"].commit) == \
        ("v0.10.0", "2161f38")
    assert origin_of("datree-security.istio.io_authorizationpolicy_v1.json", origins).path == \
        "security.istio.io/authorizationpolicy_v1.json"
    datalayer = origins["datree-datalayer.gke.io_gcpdatasource_v1.json"]
    assert (datalayer.ref, datalayer.commit) == (None, "bc448ef")
    assert origins["gke-computeclass-v1-from-datree-77e4983.yaml"].repo is None
    flagger = origins["flagger-v1.44.0-crds.yaml"]
    assert (flagger.repo, flagger.ref, flagger.commit, flagger.path) == \
        ("fluxcd/flagger", "v1.44.0", "15bd6ad5", "artifacts/flagger/crd.yaml")


def test_every_pin_is_the_shared_file_sources_md_names(origins):
    assert {p.name: pin_problems(p, origins) for p in PINS} == {p.name: [] for p in PINS}


WRONG = [
    ("a checksum", FETCHED[0], dict(sha256="0" * 64)),
    ("a path", FETCHED[0], dict(path="config/crd/experimental/gateway.networking.k8s.io_gateways.yaml")),
    ("a tag", FETCHED[0], dict(tag="v1.6.0")),
    ("a repository", FETCHED[0], dict(repo="kubernetes-sigs/gateway-api-inference-extension")),
    ("a commit", next(p for p in FETCHED if p.name.startswith("lws-")), dict(commit="0" * 40)),
    ("Flagger's chart copy", next(p for p in FETCHED if p.name.startswith("flagger-")),
     dict(path="charts/flagger/crds/crd.yaml")),
    ("a branch", next(p for p in FETCHED if p.branch == "master"), dict(branch="main")),
    ("a branch's file at the branch", next(p for p in FETCHED if p.branch), dict(commit="main")),
    ("another datree file", FETCHED[-1], dict(path="security.istio.io/peerauthentication_v1.json")),
    ("a chart template", HELM_RENDERED[0], dict(template=HELM_RENDERED[1].template)),
    ("a rendering", HELM_RENDERED[0], dict(sha256=HELM_RENDERED[1].sha256)),
    ("a dump's scope", BUILT_FROM_DUMPS[0], dict(scope="Namespaced")),
    ("a dump", BUILT_FROM_DUMPS[1], dict(dump=BUILT_FROM_DUMPS[2].dump)),
    ("a built file's pin", BUILT_FROM_DUMPS[3], dict(sha256="0" * 64)),
]


@pytest.mark.parametrize(("what", "pin", "change"), WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_pin_fails(origins, what, pin, change):
    assert pin_problems(dataclasses.replace(pin, **change), origins), what


def test_the_pins_and_the_files_left_out_are_the_shared_folder():
    shared = {p.name for p in SHARED.iterdir() if p.name != "SOURCES.md"}
    pinned = [p.name for p in PINS]
    assert len(pinned) == len(set(pinned)) and not set(pinned) & set(NOT_FETCHED)
    assert set(pinned) | set(NOT_FETCHED) == shared


def test_the_fetched_files_are_completed_in_code_without_the_network(tmp_path):
    """A folder of the fetched files (as a cache holds them: the shared bytes) gets the CRDs built
    from the dumps, and then lacks nothing: the shared folder's CRDs but the files left out."""
    for pin in FETCHED + HELM_RENDERED:
        shutil.copyfile(SHARED / pin.name, tmp_path / pin.name)

    def no_network(url: str) -> bytes:
        raise AssertionError(f"fetched {url}")

    assert sorted(fill(tmp_path, no_network)) == sorted(p.name for p in BUILT_FROM_DUMPS)
    assert missing(tmp_path) == []
    for pin in BUILT_FROM_DUMPS:
        assert yaml.safe_load((tmp_path / pin.name).read_text())["spec"] == \
            yaml.safe_load((SHARED / pin.name).read_text())["spec"], pin.name


def test_no_stack_emits_a_kind_only_the_files_left_out_define(plans, crd_catalog):
    """The pins (the shared folder but NOT_FETCHED) hold a CRD for every custom kind each stack emits."""
    unheld = {(s, d["apiVersion"], d["kind"]) for s in STACKS for d in plans[s].manifests() if not is_builtin(d)
              and not unpublished(d)
              and not [v for v in crd_catalog.versions(d["apiVersion"], d["kind"]) if v.source not in NOT_FETCHED]}
    assert unheld == set()


def test_the_pinned_flagger_file_defines_what_the_rollouts_emit(tmp_path):
    """The plan validates Canaries and MetricTemplates (flagger.app/v1beta1) against the pinned file
    alone, as a user's cache holds it."""
    from vllm_gke.infra.crd_validation import load_catalog

    (pin,) = [p for p in FETCHED if p.repo == "fluxcd/flagger"]
    shutil.copyfile(SHARED / pin.name, tmp_path / pin.name)
    catalog = load_catalog(tmp_path)
    assert {k for _, k in catalog.kinds()} >= {"Canary", "MetricTemplate"}
    assert {v.source for k in ("Canary", "MetricTemplate") for v in catalog.versions("flagger.app/v1beta1", k)} == {pin.name}
