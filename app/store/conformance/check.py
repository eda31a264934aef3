"""The one conformance check for update stores, shipped so a custom store can be checked too.

    violations = await check_update_store(make_store)

`make_store` is an async callable returning a fresh, empty store (a durable one recording
operational events: opened with `events=True`); each rule runs on its own store, which the
check closes. Base rules run on every store, fenced rules on fenced and
durable stores, durable rules on durable stores. Each violation reads "<rule>: <what>".
Times are epoch milliseconds; unless a rule says otherwise max_attempts is 2.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

from app.store.conformance import (  # noqa: F401 (each family's rules register on import)
    access,
    claims,
    control,
    erasures,
    events,
    exhaustions,
    polling,
    records,
    samples,
    settles,
)
from app.store.conformance._core import _LEVELS, _REGISTERED, BOT, MAX, OTHER_BOT, Rule, _Findings
from app.store.contract import UpdateStore

__all__ = ["BOT", "MAX", "OTHER_BOT", "MakeStore", "Rule", "check_update_store"]

MakeStore = Callable[[], Awaitable[UpdateStore]]

# One module per method family registers its rules, each with its name and level:
# `records` (add, add_many, due, prune), `claims` (claim, renew, claim_owned, claim_next_owned),
# `settles` (settle, settle_owned, settle_many_owned, owns), `exhaustions` (the durable level),
# `control` (operator control, the durable level from revision 0004) and `events` (its
# operational events: the durable rules need a store opened with events=True) and `polling`
# (the long poller's lease and its offset) and `access` (who may see what, revision 0005:
# the audit log within some bots, the console's sessions) and `samples` (the console's minute
# samples, revision 0011). They
# run level by level, each level's families in the order imported above.
_RULES = sorted(
    ((name, level, rule) for rule, (name, level) in _REGISTERED.items()),
    key=lambda entry: _LEVELS[entry[1]],
)


async def check_update_store(
    make_store: MakeStore, *, only: Collection[str] | None = None
) -> list[str]:
    """Run every rule the store's capability calls for (`only`: just the rules so named); the
    violations, empty when it conforms."""
    probe = await make_store()
    try:
        capability = probe.capability
    finally:
        await probe.close()
    if capability not in _LEVELS:
        return [f"capability: {capability!r} is not base, fenced or durable"]
    violations: list[str] = []
    unknown = set(only or ()) - {name for name, _, _ in _RULES}
    if unknown:
        raise ValueError(f"no rules named {sorted(unknown)}")
    for name, level, rule in _RULES:
        if _LEVELS[level] > _LEVELS[capability] or (only is not None and name not in only):
            continue
        findings = _Findings(name)
        store = await make_store()
        try:
            await rule(store, findings)
        except Exception as error:  # a rule that crashes names the store's fault, not ours
            findings.found.append(f"{name}: raised {type(error).__name__}: {error}")
        finally:
            await store.close()
        violations += findings.found
    return violations
