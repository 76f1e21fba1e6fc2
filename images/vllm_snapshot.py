"""Snapshot what a vLLM release accepts and serves, from the real package.

    python images/vllm_snapshot.py   # in an environment with vllm installed

Writes images/vllm-versions/<version>.json (tpu-<version>.json for the vllm-tpu build) with:
  - flags: every option of the real `vllm serve` parser (option strings, value or switch,
    nargs, type name, choices), built exactly as the `vllm` CLI builds it;
  - routes: every HTTP route of the real OpenAI server app, with all tasks enabled;
  - metrics: every Prometheus metric the v1 engine declares (name and kind);
  - environment: every VLLM_* variable the release reads.
The tests check every argv the stacks generate against the flags, and the guard's and mesh's
path lists against the routes, without needing vLLM (several GB) installed.

vLLM picks a platform at import; with no GPU it finds none and refuses to build its config.
So this script pretends there is one: NVML reports one device, and the CUDA driver library
its extension modules link against is a stub compiled here (no CUDA call is ever made).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any, Optional

STUB_ENV = "VLLM_SNAPSHOT_STUB_DIR"


def _vllm_dir() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("vllm is not installed in this environment: pip install vllm==<version>")
    return Path(next(iter(spec.submodule_search_locations)))


def build_cuda_stub(out_dir: Path) -> Path:
    """libcuda.so.1 exporting every cu* symbol vLLM's extensions import, each returning an error."""
    symbols: set[str] = set()
    for lib in _vllm_dir().rglob("*.so"):
        nm = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True)
        symbols.update(m.group(1) for m in re.finditer(r"\bU (cu[A-Z]\w*)", nm.stdout))
    source = out_dir / "libcuda_stub.c"
    source.write_text("".join(f"int {s}(void) {{ return 100; }}\n" for s in sorted(symbols)) or "int cuInit(void){return 100;}\n")
    target = out_dir / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(target), "-Wl,-soname,libcuda.so.1", str(source)], check=True)
    return target


def _first(*paths: str) -> Any:
    for path in paths:
        module, _, attr = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {paths} exists in this vLLM")


def pretend_one_gpu() -> None:
    nvml = _first("vllm.utils.import_utils.import_pynvml", "vllm.utils.import_pynvml")()
    nvml.nvmlInit = lambda *a, **k: None
    nvml.nvmlShutdown = lambda *a, **k: None
    nvml.nvmlDeviceGetCount = lambda *a, **k: 1


def pretend_a_platform() -> None:
    """The TPU build has no CUDA extensions, and its TPU platform needs libtpu and JAX: the
    parser, routes and metrics are the platform-independent vLLM they share, so its snapshot is
    taken on vLLM's CPU platform."""
    if _build() != "tpu":
        pretend_one_gpu()
        return
    import vllm.platforms as platforms  # type: ignore[import-not-found]
    from vllm.platforms.cpu import CpuPlatform  # type: ignore[import-not-found]

    platforms._current_platform = CpuPlatform()


def serve_parser() -> argparse.ArgumentParser:
    flexible = _first("vllm.utils.argparse_utils.FlexibleArgumentParser", "vllm.utils.FlexibleArgumentParser")
    from vllm.entrypoints.cli.serve import ServeSubcommand  # type: ignore[import-not-found]

    top = flexible(prog="vllm")
    return ServeSubcommand().subparser_init(top.add_subparsers())


def _type_name(t: Any) -> str | None:
    if t is None:
        return None
    name = getattr(t, "__name__", None) or type(t).__name__
    return name if not name.startswith("<") else repr(t)


def describe_flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    flags: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "switch"  # --x and --no-x
        elif action.nargs == 0:
            kind = "switch"
        else:
            kind = "value"
        entry = {
            "dest": action.dest,
            "kind": kind,
            "nargs": action.nargs if not isinstance(action.nargs, int) else int(action.nargs),
            "type": _type_name(action.type),
            "choices": sorted(str(c) for c in action.choices) if action.choices else None,
        }
        for option in action.option_strings or [action.dest]:
            flags[option] = entry
    return dict(sorted(flags.items()))


def _all_tasks() -> tuple[str, ...]:
    try:
        from vllm.tasks import SupportedTask  # type: ignore[import-not-found]
    except ImportError:
        return ()
    return tuple(a for arg in typing.get_args(SupportedTask) for a in (typing.get_args(arg) or (arg,)))


def describe_routes(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    args = parser.parse_args(["/models/snapshot"])
    build_app = _first("vllm.entrypoints.launchers.app.build_app", "vllm.entrypoints.openai.api_server.build_app")
    try:
        app = build_app(args, _all_tasks())
    except TypeError:
        app = build_app(args)
    routes: dict[str, set[str]] = {}
    for path, methods in _walk_routes(app.routes):
        routes.setdefault(path, set()).update(methods)
    return [{"path": p, "methods": sorted(m)} for p, m in sorted(routes.items())]


def _walk_routes(routes: Any, prefix: str = "") -> typing.Iterator[tuple[str, set[str]]]:
    """Every (path, methods), through mounts and included routers (FastAPI >= 0.16x keeps
    included routers as lazy `_IncludedRouter` entries instead of copying their routes)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            context = getattr(route, "include_context", None)
            yield from _walk_routes(included.routes, prefix + (getattr(context, "prefix", "") or ""))
            continue
        path = getattr(route, "path", None)
        sub = getattr(route, "routes", None)
        if sub:
            yield from _walk_routes(sub, prefix + (path or ""))
        elif path:
            yield prefix + path, set(getattr(route, "methods", None) or [])


METRIC_DECL = re.compile(r"(gauge|counter|histogram)\w*\(\s*name\s*=\s*\"(vllm:[a-z0-9_:]+)\"", re.I)
# Info metrics (vllm:cache_config_info) are gauges whose name is chosen before the declaration.
INFO_DECL = re.compile(r"\bname\s*=\s*\"(vllm:[a-z0-9_:]+_info)\"")


def describe_metrics(root: Optional[Path] = None) -> list[dict[str, str]]:
    found: dict[str, str] = {}
    for source in ((root or _vllm_dir()) / "v1").rglob("*.py"):
        text = source.read_text(errors="ignore")
        for kind, name in METRIC_DECL.findall(text):
            found[name] = kind.lower()
        for name in INFO_DECL.findall(text):
            found.setdefault(name, "gauge")
    return [{"name": n, "kind": k} for n, k in sorted(found.items())]


def describe_environment() -> list[str]:
    """The VLLM_* variables the release knows (it warns about, or refuses, any other)."""
    import vllm.envs as envs  # type: ignore[import-not-found]

    return sorted(envs.environment_variables)


def _build() -> str:
    """Which vLLM distribution is installed: the TPU build (vllm-tpu) or vllm itself (CUDA)."""
    from importlib import metadata

    try:
        metadata.distribution("vllm-tpu")
    except metadata.PackageNotFoundError:
        return "cuda"
    return "tpu"


def snapshot() -> dict[str, Any]:
    import vllm  # type: ignore[import-not-found]

    pretend_a_platform()
    parser = serve_parser()
    return {
        "version": vllm.__version__.split("+")[0],
        "build": _build(),
        "generated_by": "images/vllm_snapshot.py",
        "flags": describe_flags(parser),
        "routes": describe_routes(parser),
        "metrics": describe_metrics(),
        "environment": describe_environment(),
    }


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None  # stripped only under -OO
    opts = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    opts.add_argument("--out", type=Path, default=Path(__file__).parent / "vllm-versions")
    ns = opts.parse_args(argv)
    if not os.environ.get(STUB_ENV):
        stub_dir = Path(tempfile.mkdtemp(prefix="vllm-cuda-stub-"))
        build_cuda_stub(stub_dir)
        env = dict(os.environ, **{STUB_ENV: str(stub_dir)},
                   LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(stub_dir), os.environ.get("LD_LIBRARY_PATH")])))
        try:
            return subprocess.call([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], env=env)
        finally:
            shutil.rmtree(stub_dir, ignore_errors=True)
    data = snapshot()
    ns.out.mkdir(parents=True, exist_ok=True)
    # The TPU build's file is tpu-<version>.json (components/model/vllm_versions.py VllmRelease.snapshot).
    path = ns.out / f"{'tpu-' if data['build'] == 'tpu' else ''}{data['version']}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: {len(data['flags'])} flags, {len(data['routes'])} routes, {len(data['metrics'])} metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
