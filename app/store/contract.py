"""The store contract: three capability levels, each a typing Protocol composed of the roles
each family offers (`app.store.<family>.roles`).

A store declares the highest level it meets in `capability`. Times are integer epoch
milliseconds passed in by the caller, so every rule is testable without a clock. A consumer
types its store as the narrowest role it uses (the group commit a `Recorder`, the settler
`FencedSettles`); these levels are for what needs a whole store.

- base (`UpdateStore`): revision 0001 columns only, fenced by attempt number (a table below
  the head revision serves this level until upgraded).
- fenced (`FencedUpdateStore`): every transition compares the full `ClaimIdentity`.
- durable (`DurableUpdateStore`): a terminal failure stays until its exact acknowledgement;
  from revision 0004 it includes operator control (`OperatorStore`: pause, rate limits,
  redrive, park, search, attempt history, the audit log, events, polling, sessions).

Levels are what a table serves; a bot's mode (plain, fenced, durable) names the level it
needs (docs/design.md decision 1).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from app.store.claims.roles import Claims, FencedClaims
from app.store.control.roles import Control
from app.store.erasures.roles import Erasures
from app.store.events.roles import Events
from app.store.exhaustions.roles import BulkExhaustions, Exhaustions
from app.store.keys.roles import Keys
from app.store.lifecycle import Lifecycle
from app.store.polling.roles import Polling
from app.store.records.roles import Records
from app.store.samples.roles import Samples
from app.store.sessions.roles import Sessions
from app.store.settles.roles import FencedSettles, Settles
from app.store.views.roles import OperatorViews, Views


@runtime_checkable
class UpdateStore(Lifecycle, Records, Views, Claims, Settles, Protocol):
    """Base level: record, claim, renew, settle, list due rows and prune."""


@runtime_checkable
class FencedUpdateStore(UpdateStore, FencedClaims, FencedSettles, Protocol):
    """Fenced level: each claim persists a fresh `claim_id`. A live schema serves it only at
    the head revision, where it serves the durable level too (docs/design.md decision 1)."""


@runtime_checkable
class DurableUpdateStore(FencedUpdateStore, Exhaustions, Protocol):
    """Durable level: exhaustions survive until exactly acknowledged, and their delivery to
    `exhaustion_url` is leased across processes."""


@runtime_checkable
class OperatorStore(
    DurableUpdateStore,
    Control,
    BulkExhaustions,
    OperatorViews,
    Events,
    Polling,
    Sessions,
    Erasures,
    Keys,
    Samples,
    Protocol,
):
    """Operator control (docs/contract.md section 9), part of the durable level from revision
    0004: what an operator sees and does, persisted so that every process on every host
    honours it. Every action takes `by`, the name it is recorded under in the audit log (an API
    key's name, never the key), and writes that record in the transaction that acts."""
