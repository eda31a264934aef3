"""Both kits build as packages and work installed alone: the Python kit's wheel
(`python -m build`) in a fresh virtualenv that has only its dependencies, and the TypeScript
kit's tarball (`npm pack`) in an empty Node project."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.kit.node import installed, npm, one_at_a_time, tools
from tests.processes import ROOT

# Slow, but measuring nothing: a group of their own, beside the timed slow tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("kit-packages")]

USE_THE_WHEEL = textwrap.dedent(
    """
    import sys
    import telegram_intake_kit
    from telegram_intake_kit import Identity, Terminal, current_attempt, read_forwarded, sign

    assert telegram_intake_kit.__file__.startswith(sys.argv[1]), telegram_intake_kit.__file__
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"update_id": 7}'
    headers = {
        "x-intake-bot": "shop", "x-intake-update-id": "7", "x-intake-attempt": "1",
        "x-intake-claim-id": "c-1", "webhook-id": "shop:7", "webhook-timestamp": "1700000000",
        "webhook-signature": sign(secret, "shop:7", 1700000000, body),
    }
    forwarded = read_forwarded(headers, body, signing_secret=secret, now=1700000000)
    assert forwarded.identity == Identity(bot="shop", update_id=7, attempt=1, claim_id="c-1")
    assert current_attempt() is None and issubclass(Terminal, Exception)
    for absent in ("app", "aiogram", "telegram", "sqlalchemy", "fastapi"):
        try:
            __import__(absent)
        except ImportError:
            continue
        raise AssertionError(f"{absent} is installed beside the kit")
    print("wheel ok")
    """
)


def test_the_python_kit_builds_and_works_installed_alone(tmp_path: Path) -> None:
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", dist, ROOT / "kit" / "python"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("telegram_intake_kit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(metadata).decode())
        assert "telegram_intake_kit/py.typed" in archive.namelist()
    required = meta.get_all("Requires-Dist") or []
    assert sorted(r for r in required if "extra ==" not in r) == ["httpx>=0.27", "pydantic>=2.7"]
    assert set(meta.get_all("Provides-Extra") or []) == {"aiogram", "ptb", "fence", "otel"}

    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, wheel], check=True, capture_output=True, timeout=600)
    done = subprocess.run(
        [python, "-c", USE_THE_WHEEL, str(venv)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "wheel ok"


USE_THE_TARBALL = """
const kit = require("telegram-intake-kit");
const path = require.resolve("telegram-intake-kit");
if (!path.startsWith(process.argv[1])) throw new Error("resolved " + path);
for (const name of ["intakeHandler", "readForwarded", "IntakeClient", "TerminalError", "sign"]) {
  if (typeof kit[name] !== "function") throw new Error(name + " is not exported");
}
if (!(new kit.TerminalError("x") instanceof Error)) throw new Error("TerminalError");
console.log("tarball ok");
"""


def test_the_typescript_kit_packs_and_works_installed_alone(tmp_path: Path) -> None:
    node, program = tools()
    with one_at_a_time():
        installed()  # prepack compiles with the kit's own TypeScript
        packed = npm("pack", "--pack-destination", str(tmp_path), "--silent")
    (tarball,) = tmp_path.glob("telegram-intake-kit-*.tgz")
    assert tarball.name in packed.stdout
    project = tmp_path / "project"
    project.mkdir()
    for command in (["init", "-y"], ["install", "--no-audit", "--no-fund", str(tarball)]):
        done = subprocess.run(
            [program, *command], cwd=project, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
    unpacked = project / "node_modules" / "telegram-intake-kit"
    assert {p.name for p in unpacked.iterdir()} >= {"package.json", "dist"}
    assert not (unpacked / "src").exists()  # the compiled package, not its sources
    assert not (project / "node_modules" / "grammy").exists()  # peers stay the bot's choice
    done = subprocess.run(
        [node, "-e", USE_THE_TARBALL, str(unpacked)],
        cwd=project, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tarball ok"
