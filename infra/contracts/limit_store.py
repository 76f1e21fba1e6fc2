"""Redis (the limit store): no persistence, and scripts held to the caller's ACL."""

from __future__ import annotations

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
        if not users or any("~rl:*" not in u or "+evalsha" not in u or "allkeys" in u or "~*" in u for u in users):
            out.append("redis.conf's ACL does not confine the script to rl: keys")
    return out


ROWS: tuple[Contract, ...] = (
    Contract("Redis", "7.4.2",
             "with save \"\" and appendonly no it writes no file, on shutdown either; commands a script calls are "
             "checked against the caller's ACL and key patterns",
             "redis/redis@7.4.1 (7.4.2 changes none of it):src/server.c:4474-4485; src/config.c:2705-2713; "
             "src/script.c:575-602; src/acl.c:1673",
             "no persistence under a read-only root filesystem; one ACL user confined to ~rl:* and the script's "
             "commands", redis_writes_nothing_and_scripts_obey_the_acl),
)
