"""The wheel an operator installs holds everything the service needs, migrations included:
`telegram-intake migrate` from an installed wheel, far from any checkout, reaches head."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from app.store.migrate import current_revision
from app.store.schema import HEAD

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_of_app_is_in_the_wheel_list() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(path.relative_to(ROOT).parent.parts)
        for path in (ROOT / "app").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


# In a fresh interpreter: each module of app/ imported first, with no app module loaded, and
# what failed. An import circle shows only in some orders (app.intake.route first once failed
# where app.main first did not).
IMPORT_EACH_FIRST = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "app" or m.startswith("app.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\\n".join(failed))
"""


def test_every_module_of_app_imports_first() -> None:
    modules = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / "app").rglob("*.py")
        if "__pycache__" not in path.parts and path.name != "__main__.py"
    )
    assert "app.intake.route" in modules
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, *modules],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == "", result.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("packaging")  # untimed: not in the serial group
def test_an_installed_wheel_migrates_without_the_checkout(tmp_path: Path) -> None:
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", wheels, ROOT], check=True, timeout=300)
    (wheel,) = wheels.glob("telegram_intake-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", target, wheel], check=True, timeout=300
    )
    url = f"sqlite:///{elsewhere / 'intake.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
    env |= {"PYTHONPATH": str(target), "INTAKE_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-c", "import app, sys; from app.cli import main; "
         "assert app.__file__.startswith(sys.argv[1]), app.__file__; sys.exit(main(['migrate']))",
         str(target)],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"database at revision {HEAD}" in done.stdout
    assert current_revision(url) == HEAD
    # The console's pages and files came with it: every template and static file of the
    # checkout is in the installed package.
    for kind in ("templates", "static"):
        shipped = {f.name for f in (target / "app" / "console" / kind).iterdir()}
        assert shipped == {f.name for f in (ROOT / "app" / "console" / kind).iterdir()}, kind


def test_the_readmes_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    """The README promises two commands for a fresh machine; .ci/run runs the test one as
    written, so what CI proves is what a reader runs."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    section = readme[start : readme.index("\n## ", start + 1)]
    commands = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    assert len(commands) == 2, commands
    serve, test = commands
    assert serve.endswith("telegram-intake run --demo")
    assert "pytest" in test
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, f".ci/run does not run the README's test command: {test}"
