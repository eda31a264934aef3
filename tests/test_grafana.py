"""The Grafana dashboard shipped in deploy/grafana/ (issue 50): it parses as Grafana's dashboard
JSON (the fields Grafana reads, panels that fit its grid, every variable an expression uses
defined), and every metric its PromQL names is in `/metrics` of a running service with
traffic: a bot with a destination, updates delivered, retried and exhausted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import Response

from app.destinations.settings import DestinationSettings
from tests.api.conftest import API_KEYS
from tests.conftest import Storage
from tests.downstream import (
    SIGNING_SECRET,
    FakeDownstream,
    Received,
    bot,
    eventually,
    message,
    settings_for,
)
from tests.test_metrics import serving

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "telegram-intake.json"
PANEL_TYPES = {"row", "timeseries", "stat", "table", "bargauge", "gauge", "text"}
METRIC = re.compile(r"\b(?:telegram_intake|process)_[a-z_]+\b")
VARIABLE = re.compile(r"\$(?:\{)?([a-z_]+)")
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def targets(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [target for panel in board["panels"] for target in panel.get("targets", [])]


def test_the_dashboard_is_grafana_dashboard_json() -> None:
    board = dashboard()
    assert isinstance(board["title"], str)
    assert board["uid"] == "telegram-intake"
    assert board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    defined = {variable["name"] for variable in board["templating"]["list"]}
    assert {"datasource", "bot", "destination"} <= defined
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        references = [target["refId"] for target in panel["targets"]]
        assert references, panel["title"]
        assert len(references) == len(set(references)), panel["title"]
    for target in targets(board):
        used = set(VARIABLE.findall(target["expr"])) - GRAFANA_VARIABLES
        assert used <= defined, (target["expr"], used - defined)
        assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    for variable in board["templating"]["list"]:
        for name in METRIC.findall(json.dumps(variable.get("query", ""))):
            assert name.startswith("telegram_intake_"), name


async def test_every_metric_the_dashboard_names_is_served(
    storage: Storage, downstream: FakeDownstream
) -> None:
    answers = {1: 200, 2: 503, 3: 400}  # delivered; retried, then delivered; exhausted

    async def answer(received: Received, _request: Request) -> Response:
        status = answers.get(received.update_id, 200) if received.attempt == 1 else 200
        return Response("{}", status, media_type="application/json")

    downstream.answer = answer
    analytics = DestinationSettings.model_validate(
        {"name": "analytics", "url": f"{downstream.url}/hook", "ordered": False}
    )
    shop = bot(downstream, mode="durable", destinations=(analytics,))
    settings = settings_for(
        storage.url(),
        shop,
        api_keys=API_KEYS,
        operations_url=f"{downstream.url}/operations",
        operations_signing_secret=SIGNING_SECRET,
    )
    async with serving(settings, workers=True) as service:
        for update_id in answers:
            assert (await service.post("shop", message(update_id))).status_code == 200

        async def served() -> str | None:
            text = (await service.get_metrics()).text
            done = all(
                words in text
                for words in ('outcome="terminal"} 1.0', "delivery_seconds_count", "events_total{")
            )
            return text if done else None

        exposition = await eventually(served)
    names = {
        sample.name
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    named = {name for target in targets(dashboard()) for name in METRIC.findall(target["expr"])}
    assert len(named) >= 20, named  # what the check below covers
    assert named - names == set()
    # The four delivery views have something to draw.
    assert {
        "telegram_intake_delivery_seconds_bucket",
        "telegram_intake_forward_answers_total",
    } <= names
    assert "process_cpu_seconds_total" in names
