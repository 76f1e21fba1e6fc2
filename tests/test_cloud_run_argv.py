"""The Cloud Run models' `vllm serve` argv, as the staging plan declares it on the service, parsed by the
pinned vLLM's real parser (`vllm serve`'s own, in the interpreter VLLM_PYTHON names) and validated as
`vllm serve` validates it: the flag names, their values and the checks across them, with the tenant
guard's middleware among them."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest

from tests.conftest import REPO_ROOT, props_of
from vllm_gke.infra.plan import run_program

# The platform stubbed to CPU (this machine has no GPU), as tests/test_kv_offload.py does.
SERVE_ARGS = """
import json, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.check_and_update_config = classmethod(lambda cls, c: None)
platforms._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
parser = make_arg_parser(FlexibleArgumentParser())
args = parser.parse_args(json.loads(sys.argv[1]))
validate_parsed_serve_args(args)
print(json.dumps({"model": args.model_tag, "port": args.port, "middleware": args.middleware,
                  "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
                  "served": args.served_model_name}))
"""


def vllm_python() -> str:
    python = os.environ.get("VLLM_PYTHON", "")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("CI checks the Cloud Run models' argv against the pinned vLLM: set VLLM_PYTHON")
        pytest.skip("VLLM_PYTHON (a python with the pinned vllm) is not set")
    return python


def test_the_services_argv_parses_with_vllms_own_serve_parser(stack_values):
    python = vllm_python()
    plan = run_program("staging", copy.deepcopy(stack_values["staging"]))
    (service,) = props_of(plan, "gcp:cloudrunv2/service:Service")
    server = service["template"]["containers"][0]
    out = subprocess.run([python, "-c", SERVE_ARGS, json.dumps(server["args"])], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # The model from the bucket's volume, served under its name, on the port Cloud Run sends to, behind the guard.
    assert got["model"].startswith("/models/") and got["served"] == ["qwen-1-5b"]
    assert got["port"] == server["ports"]["containerPort"]
    assert got["middleware"] == ["vllm_gke_guard.GuardMiddleware"]
    assert (got["max_num_seqs"], got["max_model_len"]) == (32, 8192)
