"""A platform's settings validated with the stack config's messages, wherever they come from.

A stack file names a key `vllm-gke:nodePools[a100-mig].minNodes`; a program that builds the
settings in code names it as it wrote it, `config.nodePools[a100-mig].minNodes`. Both get the same
words: list items by their name, `did you mean` for a misspelt key, pydantic's errors in plain
words, then the checks across fields (config_rules). infra/config.py reads stacks through here;
Platform validates a settings mapping given in code through here.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Mapping, Optional, cast, get_args

from pydantic import BaseModel, ValidationError

from .config_rules import cross_field_issues
from .stack_config import ConfigError, ConfigIssue, StackConfig, plain_problem

Head = Callable[[str], str]


def _field(node: Any, key: str) -> Any:
    return cast(Mapping[str, Any], node).get(key) if isinstance(node, Mapping) else None


def _item_key(items: Any, index: int) -> tuple[str, Any]:
    """`[name]` for a list item whose name its list does not repeat, else `[index]`; and the item."""
    listed = cast(list[Any], items) if isinstance(items, list) else []
    item = listed[index] if 0 <= index < len(listed) else None
    name, names = _field(item, "name"), [_field(x, "name") for x in listed]
    return (f"[{name}]" if isinstance(name, str) and name and names.count(name) == 1 else f"[{index}]"), item


def key_path(loc: tuple[Any, ...], data: Any, head: Head) -> str:
    """('nodePools', 0, 'machineType') -> head('nodePools') + '[a100-mig].machineType'."""
    if not loc:
        return head("<root>")
    key, node = head(str(loc[0])), _field(data, str(loc[0]))
    for part in loc[1:]:
        if isinstance(part, int):
            step, node = _item_key(node, part)
            key += step
        else:
            key, node = key + f".{part}", _field(node, str(part))
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


def did_you_mean(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc)
    if model is None or not loc:
        return ""
    known = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def problem(err: Mapping[str, Any], where: str = "the stack config") -> str:
    """One pydantic error in the stack config's words; `where` is what the user edits."""
    kind = err["type"]
    if kind == "missing":
        return f"is required but not set; add it to {where}"
    if kind == "extra_forbidden":
        return ("is not a known setting" + (did_you_mean(tuple(err.get("loc") or ())) or
                                            "; remove it or fix its spelling (see docs/reference/config.md)"))
    return plain_problem(err)


def config_issues(data: Mapping[str, Any], head: Head,
                  where: str = "the stack config") -> tuple[Optional[StackConfig], list[ConfigIssue]]:
    """The settings as a StackConfig, or None, and every problem: per key, then across fields."""
    try:
        cfg = StackConfig.model_validate(data)
    except ValidationError as exc:
        return None, [ConfigIssue(key_path(tuple(e["loc"]), data, head), problem(e, where)) for e in exc.errors()]
    return cfg, cross_field_issues(cfg)


def stack_config(data: Mapping[str, Any], name: str = "config", source: str = "platform config") -> StackConfig:
    """Settings written in code (camelCase keys, as a stack file's) as a StackConfig; every problem
    at once as a ConfigError whose keys start with `name` (`config.nodePools[gpu].minNodes`)."""
    cfg, issues = config_issues(data, lambda first: f"{name}.{first}", f"{name}")
    if issues:
        raise ConfigError(issues, source)
    assert cfg is not None
    return cfg


def in_program_words(issues: list[ConfigIssue], name: str = "config") -> list[ConfigIssue]:
    """Issues the checks across fields name as a stack file does (`vllm-gke:models[x]`, `gcp:region`),
    named as a program's settings are (`config.models[x]`, `config.region`), in key and text alike."""
    def words(text: str) -> str:
        text = re.sub(r"\bgcp:(project|region)\b", rf"{name}.\1", text)
        return re.sub(r"\bvllm-gke:(?=[A-Za-z<])", f"{name}.", text)
    return [ConfigIssue(words(i.key), words(i.problem)) for i in issues]
