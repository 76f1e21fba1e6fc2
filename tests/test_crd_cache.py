"""The plan's CRD folder (infra/crd_cache.py): which folder it takes, in order, and the user's cache
filled once from the pinned URLs, each file checked against its sha256. On small pins of its own
(the real ones are tests/test_crd_sources.py's), served by a fake opener or a loopback HTTP server:
no test here reaches the network."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import threading
import urllib.error
from typing import Iterator

import pytest
import yaml

from vllm_gke.infra import crd_cache
from vllm_gke.infra.crd_cache import (
    CACHE_ENV,
    OFFLINE_ENV,
    build_from_dump,
    cache_folder,
    cache_root,
    crd_folder,
    main,
    render_helm_crd,
    urlopen_bytes,
)
from vllm_gke.infra.crd_sources import RAW, BuiltFromDump, Fetched, HelmRendered
from vllm_gke.infra.crd_validation import CRD_DIR_ENV, load_catalog


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


WIDGET_CRD = b"""apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
"""
TEMPLATE = b"""{{- if .Values.crds.install }}
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  labels:
    app.kubernetes.io/name: {{ .Values.operator.name }}
    {{- include "keda.crd-labels" . | indent 4 }}
  name: gadgets.example.com
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    schema:
      openAPIV3Schema: {type: object, properties: {spec: {type: object}}}
{{- end -}}
"""
DUMP = json.dumps({"type": "object", "properties": {"spec": {"type": "object", "additionalProperties": False,
                                                             "properties": {"uri": {"type": "string"}}}}}).encode()
RENDERED = render_helm_crd(TEMPLATE.decode()).encode()
WIDGETS = Fetched("widgets.yaml", "example/widgets", "crds/widgets.yaml", "a" * 40, sha(WIDGET_CRD), tag="v1.0.0")
DUMP_PIN = Fetched("datree-example.com_thing_v1.json", "example/catalog", "example.com/thing_v1.json", "b" * 40, sha(DUMP))
GADGETS = HelmRendered("gadgets.yaml", Fetched("crd-gadgets.yaml", "example/charts", "crds/crd-gadgets.yaml", "c" * 40,
                                               sha(TEMPLATE), tag="v2.0.0"), sha(RENDERED))
UNPINNED = BuiltFromDump("thing-from-dump.yaml", DUMP_PIN.name, "Thing", "things", "Namespaced", "")
THING = dataclasses.replace(UNPINNED, sha256=sha(build_from_dump(UNPINNED, DUMP.decode())))
PINS = (WIDGETS, DUMP_PIN, GADGETS, THING)
SERVED = {WIDGETS.url: WIDGET_CRD, DUMP_PIN.url: DUMP, GADGETS.template.url: TEMPLATE}


class FakeOpener:
    def __init__(self, served: dict[str, bytes]):
        self.served, self.asked = served, []

    def __call__(self, url: str) -> bytes:
        self.asked.append(url)
        if url not in self.served:
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return self.served[url]


def no_network(url: str) -> bytes:
    raise AssertionError(f"fetched {url}")


@pytest.fixture(autouse=True)
def small_pins(monkeypatch):
    monkeypatch.setattr(crd_cache, "PINS", PINS)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """No CRD folder named, the cache under tmp_path."""
    return {CACHE_ENV: str(tmp_path / "cache")}


def test_the_helm_template_renders_as_the_chart_installs_it():
    assert "{{" not in RENDERED.decode()
    crd = yaml.safe_load(RENDERED)
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/name": "keda-operator"}
    assert crd["spec"]["names"]["kind"] == "Gadget"


def test_a_dump_becomes_a_crd_the_validation_reads(tmp_path):
    crd = yaml.safe_load(build_from_dump(THING, DUMP.decode()))
    assert crd["metadata"]["name"] == "things.example.com" and crd["spec"]["scope"] == "Namespaced"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "additionalProperties" not in schema["properties"]["spec"]  # a structural schema may not close objects
    assert list(schema["properties"]) == ["apiVersion", "kind", "metadata", "spec"]


def test_the_cache_is_filled_once_then_used_without_fetching(env, tmp_path):
    opener = FakeOpener(SERVED)
    first = crd_folder(None, opener=opener, environ=env, shared=tmp_path / "no-shared")
    assert first.path == cache_folder(env) and "4 fetched now" in first.origin
    assert sorted(opener.asked) == sorted(SERVED)
    assert {p.name for p in first.path.iterdir()} == {p.name for p in PINS}
    assert {k for k, _v in load_catalog(first.path).kinds()} == {"example.com/v1"}
    second = crd_folder(None, opener=no_network, environ=env, shared=tmp_path / "no-shared")
    assert second == crd_cache.CrdFolder(first.path, f"{first.path} (the pinned upstream CRDs, cached)")


def test_a_file_that_changed_is_fetched_again(env, tmp_path):
    folder = crd_folder(None, opener=FakeOpener(SERVED), environ=env, shared=tmp_path / "no-shared").path
    assert folder is not None
    (folder / WIDGETS.name).write_text("truncated")
    opener = FakeOpener(SERVED)
    assert crd_folder(None, opener=opener, environ=env, shared=tmp_path / "no-shared").path == folder
    assert opener.asked == [WIDGETS.url] and (folder / WIDGETS.name).read_bytes() == WIDGET_CRD


def test_a_checksum_mismatch_is_refused(env, tmp_path):
    served = {**SERVED, WIDGETS.url: WIDGET_CRD.replace(b"integer", b"string")}
    got = crd_folder(None, opener=FakeOpener(served), environ=env, shared=tmp_path / "no-shared")
    assert got.path is None
    assert got.origin.startswith("no upstream CRDs: 1 of 4 files failed (refused ")
    assert (f"refused {WIDGETS.url}: its sha256 is {sha(served[WIDGETS.url])}, not the {WIDGETS.sha256} that "
            "infra/crd_sources.py pins for widgets.yaml") in got.origin
    assert "nothing of it was written" in got.origin and f"--crds DIR or {CRD_DIR_ENV}=DIR" in got.origin
    assert not (cache_folder(env) / WIDGETS.name).exists()
    # The others were tried and kept: the next run fetches only the one that failed.
    assert (cache_folder(env) / GADGETS.name).exists() and not list(cache_folder(env).glob(".*.tmp"))


def test_a_chart_template_that_changed_is_refused(env, tmp_path):
    served = {**SERVED, GADGETS.template.url: TEMPLATE + b"# more\n"}
    got = crd_folder(None, opener=FakeOpener(served), environ=env, shared=tmp_path / "no-shared")
    assert got.path is None and f"refused {GADGETS.template.url}" in got.origin
    assert not (cache_folder(env) / GADGETS.name).exists()


def test_offline_says_what_it_tried_and_how_to_point_at_a_folder(env, tmp_path):
    got = crd_folder(None, opener=FakeOpener({}), environ=env, shared=tmp_path / "no-shared")
    assert got.path is None
    assert got.origin.startswith(f"no upstream CRDs: 4 of 4 files failed (could not fetch {WIDGETS.url} (URLError: ")
    assert f"4 of 4 pinned CRD files are not in the cache {cache_folder(env)}" in got.origin
    assert "raw.githubusercontent.com" in got.origin and f"--crds DIR or {CRD_DIR_ENV}=DIR" in got.origin
    assert "python -m vllm_gke.infra.crd_cache --into DIR" in got.origin


def test_a_cache_it_cannot_write_is_said(tmp_path):
    (tmp_path / "a-file").write_text("")
    env = {CACHE_ENV: str(tmp_path / "a-file")}
    got = crd_folder(None, opener=FakeOpener(SERVED), environ=env, shared=tmp_path / "no-shared")
    assert got.path is None and got.origin.startswith(f"no upstream CRDs: cannot write the cache {cache_folder(env)} (")
    assert f"set {CACHE_ENV} to a folder you can write" in got.origin


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_fetching_off_never_fetches_and_says_so(env, tmp_path, how):
    environ = {**env, OFFLINE_ENV: "1"} if how == "environment" else env
    got = crd_folder(None, fetch=how != "argument", opener=no_network, environ=environ, shared=tmp_path / "no-shared")
    assert got.path is None and "fetching is off (--offline or VLLM_GKE_OFFLINE)" in got.origin
    assert f"--crds DIR or {CRD_DIR_ENV}=DIR" in got.origin


def test_fetching_off_still_uses_a_full_cache(env, tmp_path):
    crd_folder(None, opener=FakeOpener(SERVED), environ=env, shared=tmp_path / "no-shared")
    got = crd_folder(None, fetch=False, opener=no_network, environ={**env, OFFLINE_ENV: "1"}, shared=tmp_path / "x")
    assert got.path == cache_folder(env)


def test_the_folder_is_the_first_of_crds_env_shared_cache(env, tmp_path):
    explicit, named, shared = (tmp_path / n for n in ("explicit", "named", "shared"))
    for folder in (explicit, named, shared):
        folder.mkdir()
    with_env = {**env, CRD_DIR_ENV: str(named)}
    assert crd_folder(explicit, opener=no_network, environ=with_env, shared=shared).path == explicit
    assert crd_folder(None, opener=no_network, environ=with_env, shared=shared).origin == f"{named} (${CRD_DIR_ENV})"
    assert crd_folder(None, opener=no_network, environ=env, shared=shared).path == shared
    assert crd_folder(None, opener=FakeOpener(SERVED), environ=env, shared=tmp_path / "absent").path == cache_folder(env)


def test_a_named_folder_that_is_absent_is_not_passed_over(env, tmp_path):
    """--crds or $VLLM_GKE_CRDS_DIR naming nothing: said, never another folder or a fetch instead."""
    (tmp_path / "shared").mkdir()
    got = crd_folder(tmp_path / "nope", opener=no_network, environ=env, shared=tmp_path / "shared")
    assert got == crd_cache.CrdFolder(None, f"no upstream CRDs at {tmp_path / 'nope'} (--crds): not a folder")
    got = crd_folder(None, opener=no_network, environ={**env, CRD_DIR_ENV: str(tmp_path / "nope")},
                     shared=tmp_path / "shared")
    assert got.path is None and got.origin.startswith(f"no upstream CRDs at {tmp_path / 'nope'} (${CRD_DIR_ENV})")


def test_the_cache_is_the_platforms_unless_named(tmp_path, monkeypatch):
    assert cache_root({CACHE_ENV: str(tmp_path / "c")}) == tmp_path / "c"
    monkeypatch.setattr(crd_cache.sys, "platform", "linux")
    monkeypatch.setattr(crd_cache.os, "name", "posix")
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg" / "vllm-gke"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root({}) == tmp_path / "home" / ".cache" / "vllm-gke"
    assert cache_folder({}).parent == tmp_path / "home" / ".cache" / "vllm-gke" / "crds"


def test_new_pins_get_a_folder_of_their_own(env, monkeypatch):
    before = cache_folder(env)
    monkeypatch.setattr(crd_cache, "PINS", PINS[:-1])
    assert cache_folder(env) != before


@pytest.fixture
def server() -> Iterator[str]:
    """A loopback HTTP server answering RAW's paths with SERVED's bytes (404 for the rest)."""
    by_path = {url.removeprefix(RAW): body for url, body in SERVED.items()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = by_path.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"not found")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_default_opener_fetches_over_http(env, tmp_path, server):
    def loopback(url: str) -> bytes:
        return urlopen_bytes(url.replace(RAW, server))

    got = crd_folder(None, opener=loopback, environ=env, shared=tmp_path / "no-shared")
    assert got.path == cache_folder(env) and (got.path / GADGETS.name).read_bytes() == RENDERED


def test_a_missing_file_upstream_is_said_with_its_status(env, tmp_path, server):
    def loopback(url: str) -> bytes:
        return urlopen_bytes(url.replace(RAW, server).replace("widgets.yaml", "gone.yaml"))

    got = crd_folder(None, opener=loopback, environ=env, shared=tmp_path / "no-shared")
    assert got.path is None and f"could not fetch {WIDGETS.url} (HTTPError: HTTP Error 404" in got.origin


def test_the_module_lists_and_fills_a_folder(tmp_path, capsys, monkeypatch):
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert f"widgets.yaml  sha256 {WIDGETS.sha256}  {WIDGETS.url}" in listed
    assert f"rendered from {GADGETS.template.url}" in listed and f"built from {DUMP_PIN.name}" in listed
    monkeypatch.setattr(crd_cache, "urlopen_bytes", FakeOpener({}))
    assert main(["--into", str(tmp_path / "d")]) == 1
    assert "could not fetch" in capsys.readouterr().err
    monkeypatch.setattr(crd_cache, "urlopen_bytes", FakeOpener(SERVED))
    assert main(["--into", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'd'}: 4 upstream CRD files (4 fetched now)\n"
