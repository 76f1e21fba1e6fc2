"""Stack config: read from Pulumi config, validated by pydantic, checked across fields.

Every problem becomes a ConfigIssue naming the config key (as written in stacks/*.yaml) and
the fix. `pulumi up` prints a ConfigError without a stack trace (infra/__main__.py raises it as a
pulumi.RunError), and the offline plan prints it and exits 2.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any, Mapping, Optional, get_args

import pulumi
from pulumi.runtime.config import CONFIG
from pydantic import BaseModel, ValidationError

from ..components.model.config_rules import cross_field_issues
from ..components.model.stack_config import ConfigError, ConfigIssue, StackConfig, plain_problem

PROJECT = "vllm-gke"
# Fields that live in another provider's namespace in stack config.
FOREIGN_KEYS = {"project": "gcp:project", "region": "gcp:region"}


def config_key(loc: tuple[Any, ...], data: Any = None) -> str:
    """('nodePools', 0, 'machineType') -> 'vllm-gke:nodePools[0].machineType'; with the config's
    `data`, a list item by its name where it has one ('nodePools[a100-mig]'), as the file reads.
    An item without a name (or one its list repeats, so the name would be ambiguous) keeps its index."""
    if not loc:
        return f"{PROJECT}:<root>"
    head = str(loc[0])
    snake = {f.alias: n for n, f in StackConfig.model_fields.items()}.get(head, head)
    key = FOREIGN_KEYS.get(snake, f"{PROJECT}:{head}")
    node = data.get(head) if isinstance(data, Mapping) else None
    for part in loc[1:]:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = item.get("name") if isinstance(item, Mapping) else None
            unique = isinstance(node, list) and sum(
                isinstance(x, Mapping) and x.get("name") == name for x in node) == 1
            key += f"[{name}]" if isinstance(name, str) and name and unique else f"[{part}]"
            node = item
        else:
            key += f".{part}"
            node = node.get(part) if isinstance(node, Mapping) else None
    return key


def _model_at(loc: tuple[Any, ...]) -> Optional[type[BaseModel]]:
    """The pydantic model whose field `loc` names (for 'did you mean')."""
    model: Any = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        if part not in fields:
            return None
        annotation = fields[part].annotation
        for _ in range(3):  # Optional[...], list[...]: down to the model
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                break
            args = [a for a in get_args(annotation) if a is not type(None)]
            annotation = args[0] if args else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc)
    if model is None or not loc:
        return ""
    known = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _problem(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "is required but not set; add it to the stack config"
    if kind == "extra_forbidden":
        return ("is not a known setting" + (_did_you_mean(tuple(err.get("loc") or ())) or
                                            "; remove it or fix its spelling (see docs/reference/config.md)"))
    return plain_problem(err)


def parse(values: Mapping[str, Any], source: str = "stack config") -> StackConfig:
    """Build a StackConfig from {field alias or gcp key: value}; raise ConfigError on any problem."""
    data = {}
    for name, field in StackConfig.model_fields.items():
        key = FOREIGN_KEYS.get(name, f"{PROJECT}:{field.alias}")
        if key in values:
            data[field.alias] = values[key]
    unknown = [k for k in values if k.startswith(f"{PROJECT}:")
               and k.split(":", 1)[1] not in {f.alias for f in StackConfig.model_fields.values()}]
    issues = [ConfigIssue(k, _problem({"type": "extra_forbidden", "msg": ""})) for k in unknown]
    try:
        cfg: Optional[StackConfig] = StackConfig.model_validate(data)
    except ValidationError as exc:
        cfg = None
        issues += [ConfigIssue(config_key(e["loc"], data), _problem(e)) for e in exc.errors()]
    if cfg is not None:
        issues += cross_field_issues(cfg)
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
    return parse(values, f"config of stack '{pulumi.get_stack()}'")
