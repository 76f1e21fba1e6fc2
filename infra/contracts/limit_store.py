"""Redis (the limit store): no persistence, and the guards' function held to the caller's ACL."""

from __future__ import annotations

import re

from ..plan import Plan
from .base import Contract, _docs


def redis_writes_nothing_and_scripts_obey_the_acl(plan: Plan) -> list[str]:
    out = []
    for cm in _docs(plan, "ConfigMap"):
        conf = (cm.get("data") or {}).get("redis.conf")
        if conf is None:
            continue
        lines = {line.strip() for line in conf.splitlines()}
        if 'save ""' not in lines or "appendonly no" not in lines:
            out.append("redis.conf keeps persistence on: Redis would write to its read-only root filesystem")
        users = [line for line in lines if line.startswith("user ")]
        if not users or any("~rl:*" not in u or "+fcall" not in u or "allkeys" in u or "~*" in u for u in users):
            out.append("redis.conf's ACL does not confine the guards' function to rl: keys")
        if any(re.search(r"\+(eval|evalsha|eval_ro|evalsha_ro|script|function)\b|\+@(all|scripting)", u) for u in users):
            out.append("redis.conf's ACL lets a client run code of its own (EVAL, SCRIPT or FUNCTION)")
        if "limits.lua" not in (cm.get("data") or {}):
            out.append("the store's ConfigMap lacks the function library it loads at start")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Redis", "7.4.2",
             "with save \"\" and appendonly no it writes no file, on shutdown either; FUNCTION LOAD takes a library "
             "whose first line is #!lua name=<library> and FCALL runs a function it registered (\"Function not "
             "found\" until one is loaded: functions live in memory, and in RDB or AOF files only); the commands a "
             "script or function calls are checked against the caller's ACL and key patterns",
             "redis/redis@7.4.1 (7.4.2 changes none of it):src/server.c:4474-4485; src/config.c:2705-2713; "
             "src/functions.c:609-646,881-915,1029-1060; src/rdb.c:1344-1362,1466; src/script.c:372-384,575-602; "
             "src/acl.c:1673",
             "no persistence under a read-only root filesystem; the library is loaded at every start by a "
             "one-off user that deletes itself, the pod ready only then; the guards' ACL user has +fcall and the "
             "function's commands on ~rl:* only (no EVAL, SCRIPT or FUNCTION)",
             redis_writes_nothing_and_scripts_obey_the_acl),
)
