"""Where the plan's upstream CRDs come from: a folder named by --crds or $VLLM_GKE_CRDS_DIR, the
shared folder beside a checkout (../shared/upstream-crds, the tests'), else the files pinned in
infra/crd_sources.py, fetched once into the user's cache, each checked against its sha256.

    python -m vllm_gke.infra.crd_cache             # fill the cache (fetch what it lacks), print its folder
    python -m vllm_gke.infra.crd_cache --into DIR  # fill DIR instead: copy it to a machine with no network
    python -m vllm_gke.infra.crd_cache --list      # each file: its name, sha256 and URL (or what it is built from)

The cache: $VLLM_GKE_CACHE_DIR, else the platform's cache folder ($XDG_CACHE_HOME or ~/.cache on
Linux, ~/Library/Caches on macOS, %LOCALAPPDATA% on Windows) /vllm-gke; the CRDs under
crds/<digest of the pins>/, so new pins get a folder of their own and never mix with old files.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, cast

from .crd_sources import PINS, BuiltFromDump, Fetched, HelmRendered, Pin
from .crd_validation import CRD_DIR_ENV, DEFAULT_CRD_DIR

CACHE_ENV = "VLLM_GKE_CACHE_DIR"
OFFLINE_ENV = "VLLM_GKE_OFFLINE"  # set (not 0): never fetch, as --offline
FETCH_TIMEOUT_S = 30

Opener = Callable[[str], bytes]  # URL -> its bytes; raises OSError (urllib's errors are) when it cannot
POINT_AT_A_FOLDER = (f"point it at a folder of them: --crds DIR or {CRD_DIR_ENV}=DIR "
                     "(`python -m vllm_gke.infra.crd_cache --into DIR` fills one on a machine that reaches "
                     "raw.githubusercontent.com; `--list` prints each file's URL and sha256)")


class CrdFetchError(Exception):
    """A pinned file could not be fetched, or what came back is not the pinned file."""


@dataclass(frozen=True)
class CrdFolder:
    path: Optional[Path]  # the folder to validate custom resources against; None: they go unchecked
    origin: str  # one line for people: where the folder came from, or why there is none


def urlopen_bytes(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "vllm-gke"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
        body: bytes = response.read()
    return body


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the files built from upstream ones ------------------------------------------------------------

def render_helm_crd(template: str) -> str:
    """KEDA's chart CRD template as the chart installs it by default: the `{{- ... }}` lines (the
    install switch and optional extra annotations and labels) dropped, the operator's name set."""
    lines = [line.replace("{{ .Values.operator.name }}", "keda-operator")
             for line in template.splitlines(keepends=True) if not line.lstrip().startswith("{{-")]
    return "".join(lines)


ROOT_PROPERTIES: dict[str, Any] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}}


def _without_closed_objects(schema: Any) -> Any:
    """A dump's `additionalProperties: false`: datree's closing of objects; a CRD's structural schema
    may not hold it beside `properties` (the server prunes unknown fields instead)."""
    if isinstance(schema, dict):
        return {k: _without_closed_objects(v) for k, v in cast("dict[str, Any]", schema).items()
                if not (k == "additionalProperties" and v is False)}
    if isinstance(schema, list):
        return [_without_closed_objects(v) for v in cast("list[Any]", schema)]
    return schema


def build_from_dump(pin: BuiltFromDump, dump_text: str) -> bytes:
    """The CRD around a datree dump (`openAPIV3Schema` only), as JSON: YAML reads it the same."""
    group, _kind, version = pin.dump.removeprefix("datree-").removesuffix(".json").rsplit("_", 2)
    schema = _without_closed_objects(json.loads(dump_text))
    schema["properties"] = {**{k: v for k, v in ROOT_PROPERTIES.items() if k not in schema["properties"]},
                            **schema["properties"]}
    crd: dict[str, Any] = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"{pin.plural}.{group}",
                        "annotations": {"vllm-gke/built-from": f"{pin.dump} (infra/crd_sources.py)"}},
           "spec": {"group": group, "scope": pin.scope,
                    "names": {"kind": pin.kind, "plural": pin.plural, "singular": pin.kind.lower(),
                              "listKind": f"{pin.kind}List"},
                    "versions": [{"name": version, "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": schema}, "subresources": {"status": {}}}]}}
    return (json.dumps(crd, indent=1, ensure_ascii=False) + "\n").encode()


# --- the cache --------------------------------------------------------------------------------------

def cache_root(environ: Mapping[str, str]) -> Path:
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV])
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vllm-gke"


def pins_digest() -> str:
    return sha256_hex("".join(f"{p.name} {p.sha256}\n" for p in PINS).encode())


def cache_folder(environ: Mapping[str, str]) -> Path:
    return cache_root(environ) / "crds" / pins_digest()[:16]


def missing(folder: Path) -> list[Pin]:
    """The pinned files the folder lacks, or holds with other bytes, in the order they are made."""
    return [p for p in PINS if not ((folder / p.name).is_file() and sha256_hex((folder / p.name).read_bytes()) == p.sha256)]


def _download(pin: Fetched, opener: Opener) -> bytes:
    try:
        data = opener(pin.url)
    except (OSError, http.client.HTTPException) as exc:  # urllib's URLError and HTTPError are OSErrors
        raise CrdFetchError(f"could not fetch {pin.url} ({type(exc).__name__}: {exc})") from exc
    if (got := sha256_hex(data)) != pin.sha256:
        raise CrdFetchError(f"refused {pin.url}: its sha256 is {got}, not the {pin.sha256} that "
                            f"infra/crd_sources.py pins for {pin.name} (the file at that ref changed, or "
                            "something on the way altered it); nothing of it was written")
    return data


def _produce(pin: Pin, folder: Path, opener: Opener) -> bytes:
    if isinstance(pin, Fetched):
        return _download(pin, opener)
    if isinstance(pin, HelmRendered):
        data = render_helm_crd(_download(pin.template, opener).decode()).encode()
    else:
        data = build_from_dump(pin, (folder / pin.dump).read_text())
    if (got := sha256_hex(data)) != pin.sha256:  # the pinned inputs were right: the build differs
        raise CrdFetchError(f"built {pin.name} with sha256 {got}, not the pinned {pin.sha256}: "
                            "infra/crd_cache.py builds it otherwise than when it was pinned")
    return data


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: another plan (or thread) may be filling the same cache."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fill(folder: Path, opener: Opener = urlopen_bytes) -> list[str]:
    """Fetch (or build) each pinned file the folder lacks; the names written. The dumps come first:
    the files built from them read them from the folder. Every file is tried, so one that fails
    leaves the others cached (a later run fetches only what is missing); the failures are raised
    together at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    failed: list[str] = []
    for pin in missing(folder):
        try:
            _write(folder / pin.name, _produce(pin, folder, opener))
            written.append(pin.name)
        except CrdFetchError as exc:
            failed.append(str(exc))
        except FileNotFoundError:  # built from a dump that could not be fetched
            failed.append(f"{pin.name} not built: its source {getattr(pin, 'dump', '?')} is missing")
    if failed:
        raise CrdFetchError(f"{len(failed)} of {len(PINS)} files failed ({'; '.join(failed)})")
    return written


# --- which folder the plan validates against --------------------------------------------------------

def _on(value: Optional[str]) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no")


def _cached(folder: Path, fetch: bool, opener: Opener) -> CrdFolder:
    lacking = len(missing(folder))
    if not lacking:
        return CrdFolder(folder, f"{folder} (the pinned upstream CRDs, cached)")
    where = f"{lacking} of {len(PINS)} pinned CRD files are not in the cache {folder}"
    if not fetch:
        return CrdFolder(None, f"no upstream CRDs: {where} and fetching is off (--offline or {OFFLINE_ENV}); "
                               f"run the plan once with the network, or {POINT_AT_A_FOLDER}")
    try:
        written = fill(folder, opener)
    except CrdFetchError as exc:
        return CrdFolder(None, f"no upstream CRDs: {exc}; {where}. Run the plan once where it reaches "
                               f"raw.githubusercontent.com (they stay cached), or {POINT_AT_A_FOLDER}")
    except OSError as exc:  # the opener's are CrdFetchErrors by now: this is the cache's disk
        return CrdFolder(None, f"no upstream CRDs: cannot write the cache {folder} ({exc}); set {CACHE_ENV} to a "
                               f"folder you can write, or {POINT_AT_A_FOLDER}")
    return CrdFolder(folder, f"{folder} (the pinned upstream CRDs, {len(written)} fetched now)")


def crd_folder(explicit: Optional[Path] = None, *, fetch: bool = True, opener: Opener = urlopen_bytes,
               environ: Optional[Mapping[str, str]] = None, shared: Path = DEFAULT_CRD_DIR) -> CrdFolder:
    """The folder of upstream CRDs a plan validates custom resources against, first found of:
    `explicit` (--crds), ${VLLM_GKE_CRDS_DIR}, the shared folder beside the checkout, the user's cache
    (filled from the pinned URLs unless `fetch` is off or $VLLM_GKE_OFFLINE is set). A folder that is
    named but absent is not passed over: the plan says so rather than check against another."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return CrdFolder(explicit, f"{explicit} (--crds)") if explicit.is_dir() else \
            CrdFolder(None, f"no upstream CRDs at {explicit} (--crds): not a folder")
    if env.get(CRD_DIR_ENV):
        named = Path(env[CRD_DIR_ENV])
        return CrdFolder(named, f"{named} (${CRD_DIR_ENV})") if named.is_dir() else \
            CrdFolder(None, f"no upstream CRDs at {named} (${CRD_DIR_ENV}): not a folder")
    if shared.is_dir():
        return CrdFolder(shared, f"{shared} (the shared folder beside the checkout)")
    return _cached(cache_folder(env), fetch and not _on(env.get(OFFLINE_ENV)), opener)


# --- python -m vllm_gke.infra.crd_cache ----------------------------------------------------------------

def describe(pin: Pin) -> str:
    if isinstance(pin, Fetched):
        return f"{pin.name}  sha256 {pin.sha256}  {pin.url}"
    if isinstance(pin, HelmRendered):
        return f"{pin.name}  sha256 {pin.sha256}  rendered from {pin.template.url} (sha256 {pin.template.sha256})"
    return f"{pin.name}  sha256 {pin.sha256}  built from {pin.dump}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_gke.infra.crd_cache",
                                     description="Fetch the upstream CRDs the plan validates against.")
    parser.add_argument("--into", type=Path, help="fill this folder instead of the user's cache")
    parser.add_argument("--list", action="store_true", help="list the pinned files and stop")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(describe(p) for p in PINS))
        return 0
    folder: Path = args.into or cache_folder(os.environ)
    try:
        written = fill(folder, urlopen_bytes)
    except OSError as exc:
        print(f"error: cannot write {folder}: {exc}", file=sys.stderr)
        return 1
    except CrdFetchError as exc:
        print(f"error: {exc}; {len(missing(folder))} of {len(PINS)} pinned CRD files are not in {folder} yet "
              "(those fetched stay)", file=sys.stderr)
        return 1
    print(f"{folder}: {len(PINS)} upstream CRD files ({len(written)} fetched now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
