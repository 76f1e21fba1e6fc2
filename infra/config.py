"""Stack config: read from Pulumi config, validated by pydantic, checked across fields.

Every problem becomes a ConfigIssue naming the config key (as written in stacks/*.yaml) and
the fix. `pulumi up` prints a ConfigError without a stack trace (infra/__main__.py raises it as a
pulumi.RunError), and the offline plan prints it and exits 2.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import pulumi
from pulumi.runtime.config import CONFIG

from ..components.model.config_errors import config_issues, problem
from ..components.model.stack_config import ConfigError, ConfigIssue, StackConfig
from .model_configs import with_stack_model_configs

PROJECT = "vllm-gke"
# Fields that live in another provider's namespace in stack config.
FOREIGN_KEYS = {"project": "gcp:project", "region": "gcp:region"}


def _config_head(first: str) -> str:
    """A top-level field as the stack file spells its key: `vllm-gke:nodePools`, `gcp:project`."""
    snake = {f.alias: n for n, f in StackConfig.model_fields.items()}.get(first, first)
    return FOREIGN_KEYS.get(snake, f"{PROJECT}:{first}")


def parse(values: Mapping[str, Any], source: str = "stack config") -> StackConfig:
    """Build a StackConfig from {field alias or gcp key: value}; raise ConfigError on any problem."""
    data = {}
    for name, field in StackConfig.model_fields.items():
        key = FOREIGN_KEYS.get(name, f"{PROJECT}:{field.alias}")
        if key in values:
            data[field.alias] = values[key]
    unknown = [k for k in values if k.startswith(f"{PROJECT}:")
               and k.split(":", 1)[1] not in {f.alias for f in StackConfig.model_fields.values()}]
    issues = [ConfigIssue(k, problem({"type": "extra_forbidden", "msg": ""})) for k in unknown]
    cfg, found = config_issues(data, _config_head)
    issues += found
    if issues:
        raise ConfigError(issues, source)
    assert cfg is not None
    return cfg


def _decode(raw: str) -> Any:
    # Pulumi hands structured config over as JSON text and scalars as plain text.
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def environment_config() -> dict[str, str]:
    """PULUMI_CONFIG, as older language hosts pass config: a JSON object of strings."""
    text = os.environ.get("PULUMI_CONFIG")
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError([ConfigIssue("PULUMI_CONFIG", f"is not JSON ({exc}); it must be a JSON object of "
                                       "config keys, as `pulumi up` sets it")], "environment") from None
    if not isinstance(doc, dict):
        raise ConfigError([ConfigIssue("PULUMI_CONFIG", f"is a JSON {type(doc).__name__}, not an object of config "
                                       "keys")], "environment")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in doc.items()}


def load() -> StackConfig:
    """Read the running stack's config (under `pulumi up` or the offline plan's mocks)."""
    # The language host sets CONFIG; older hosts only pass PULUMI_CONFIG in the environment.
    raw = {**environment_config(), **CONFIG.get()}
    values = {k: _decode(v) for k, v in raw.items()
              if k.startswith(f"{PROJECT}:") or k in FOREIGN_KEYS.values()}
    source = f"config of stack '{pulumi.get_stack()}'"
    # A model given by its id alone: its shape from its config.json, cached beside the stack.
    return parse(with_stack_model_configs(values, source), source)
