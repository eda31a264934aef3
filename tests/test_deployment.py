"""The container files, checked without a Docker engine (there is none on these machines).

The compose file's structure, and that every command it gives the image is a command of the
CLI; the Dockerfile's final stage; its build stage's commands (requirements.lock installed
with its hashes, then the wheel) and the compose file's sequence (migrate, then serve,
worker and the downstream) run as plain processes on one machine, with the commands and the
INTAKE_* settings read from the compose file and the Dockerfile.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import fnmatch
import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from app.cli import build_parser
from tests.conftest import Storage, table_rows
from tests.downstream import eventually, message
from tests.processes import SECRET, Process, free_port, processes

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {"postgres", "migrate", "intake", "worker", "downstream"}
IMAGE_SERVICES = {"migrate", "intake", "worker", "downstream"}  # those built from ./Dockerfile
SECRETS = ("PGPASSWORD", "POSTGRES_PASSWORD", "INTAKE_SECRET_TOKEN", "INTAKE_API_KEYS")
SECRETS += ("INTAKE_SIGNING_SECRET", "INTAKE_BOT_TOKEN", "INTAKE_DOWNSTREAM_SECRET_TOKEN")
BUILD_TOOLS = {"gcc", "g++", "cc", "clang", "make", "build-essential", "python3-dev"}
STARTUP = 30.0  # a cold interpreter importing the app, on a loaded machine


def compose_services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def cli_args(name: str, service: Mapping[str, Any]) -> argparse.Namespace:
    """The service's command as the CLI parses it (the image's ENTRYPOINT is the CLI)."""
    command = service["command"]
    assert isinstance(command, list), f"{name}: use the exec form, a list"
    try:
        return build_parser().parse_args(command)
    except SystemExit:
        pytest.fail(f"{name}: `telegram-intake {shlex.join(command)}` is no command of the CLI")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        return list(json.loads(self.arguments.split("CMD", 1)[-1]))


def dockerfile_stages() -> list[list[Instruction]]:
    """The Dockerfile's stages (what precedes the first FROM is left out), each a list of
    instructions with continuation lines joined and comments dropped."""
    stages: list[list[Instruction]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(Instruction(keyword.upper(), arguments.strip()))
    return stages


def dockerfile_arguments() -> dict[str, str]:
    """The Dockerfile's ARGs and their defaults."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M))


def final_stage() -> list[Instruction]:
    return dockerfile_stages()[-1]


def only(stage: list[Instruction], keyword: str) -> Instruction:
    (found,) = [instruction for instruction in stage if instruction.keyword == keyword]
    return found


def declared(instruction: Instruction) -> dict[str, str]:
    """An ENV instruction's variables, as written."""
    return dict(word.split("=", 1) for word in shlex.split(instruction.arguments))


def image_environment(prefix: str = "INTAKE_") -> dict[str, str]:
    """The image's environment (its final stage's ENV), these variables."""
    values: dict[str, str] = {}
    for instruction in final_stage():
        if instruction.keyword == "ENV":
            values |= declared(instruction)
    return {name: value for name, value in values.items() if name.startswith(prefix)}


def in_workdir(stage: list[Instruction]) -> Iterator[tuple[Instruction, str]]:
    """Each instruction of the stage with the WORKDIR it runs in."""
    workdir = "/"
    for instruction in stage:
        if instruction.keyword == "WORKDIR":
            workdir = posixpath.join(workdir, instruction.arguments)
        yield instruction, workdir


def copy_targets(instruction: Instruction, workdir: str) -> dict[str, str]:
    """Source -> absolute destination of a COPY from the context."""
    *sources, destination = shlex.split(instruction.arguments)
    copies = {}
    for source in sources:
        target = posixpath.normpath(posixpath.join(workdir, destination))
        if destination.endswith(("/", ".")) and (ROOT / source).is_file():
            target = posixpath.join(target, posixpath.basename(source))
        copies[source] = target
    return copies


def from_context(instruction: Instruction) -> bool:
    return instruction.keyword == "COPY" and not instruction.arguments.startswith("--")


def copied(stage: list[Instruction]) -> dict[str, str]:
    """Source -> absolute destination of the stage's COPY instructions from the context."""
    copies: dict[str, str] = {}
    for instruction, workdir in in_workdir(stage):
        if from_context(instruction):
            copies |= copy_targets(instruction, workdir)
    return copies


def container_port(service: Mapping[str, Any]) -> int:
    published = [str(mapping).rsplit(":", 1)[-1] for mapping in service.get("ports", [])]
    (port,) = published or service["expose"]
    return int(port)


# --- docker-compose.yml ----------------------------------------------------------------------


def test_compose_has_the_five_services_and_builds_the_image_for_four() -> None:
    services = compose_services()
    assert set(services) == SERVICES
    assert {name for name, service in services.items() if service.get("build")} == IMAGE_SERVICES
    assert services["postgres"]["image"].startswith("postgres:")
    assert any("pg_isready" in word for word in services["postgres"]["healthcheck"]["test"])
    assert services["postgres"]["volumes"]


def test_compose_starts_each_service_when_what_it_needs_is_ready() -> None:
    services = compose_services()
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("intake", "worker"):
        condition = services[name]["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully", name
    assert services["migrate"]["restart"] == "no"  # one shot, not a restart loop


def test_every_command_of_the_image_is_a_command_of_the_cli() -> None:
    services = compose_services()
    commands = {name: cli_args(name, services[name]).command for name in IMAGE_SERVICES}
    assert commands == {
        "migrate": "migrate",
        "intake": "serve",
        "worker": "worker",
        "downstream": "demo-downstream",
    }


def test_the_services_reach_each_other_by_service_name_and_port() -> None:
    services = compose_services()
    env = services["worker"]["environment"]
    intake_port = int(image_environment()["INTAKE_PORT"])  # `serve` without --port
    assert cli_args("intake", services["intake"]).port is None
    assert container_port(services["intake"]) == intake_port

    downstream = cli_args("downstream", services["downstream"])
    assert downstream.host == "0.0.0.0"  # reachable from the other containers
    assert container_port(services["downstream"]) == downstream.port
    forward_to = urlsplit(env["INTAKE_DOWNSTREAM_URL"])
    assert (forward_to.hostname, forward_to.port) == ("downstream", downstream.port)
    call_back = urlsplit(downstream.intake_url)
    assert (call_back.hostname, call_back.port) == ("intake", intake_port)

    database = urlsplit(env["INTAKE_DATABASE_URL"])
    assert database.hostname == "postgres"
    assert database.path == "/" + services["postgres"]["environment"]["POSTGRES_DB"]


def test_the_image_services_share_one_environment_whose_secrets_are_never_written() -> None:
    services = compose_services()
    environments = [services[name]["environment"] for name in sorted(IMAGE_SERVICES)]
    shared = min(environments, key=len)
    for name in IMAGE_SERVICES:
        env = services[name]["environment"]
        assert {variable: env.get(variable) for variable in shared} == shared, name
        # Beyond the shared settings, only a role's own port.
        assert set(env) - set(shared) <= {"INTAKE_WORKER_PORT"}, name
    required = re.compile(r"\$\{(\w+):\?[^}]+\}")
    for name, service in services.items():
        for variable, value in service.get("environment", {}).items():
            if variable in SECRETS:
                assert required.fullmatch(value), f"{name}: {variable} is written in the file"


def test_services_that_serve_no_healthz_replace_the_image_healthcheck() -> None:
    services = compose_services()
    image_port = image_environment()["INTAKE_PORT"]
    for name in IMAGE_SERVICES:
        service = services[name]
        command = cli_args(name, service).command
        worker_port = service["environment"].get("INTAKE_WORKER_PORT")
        if command in ("run", "serve") or (command == "worker" and worker_port == image_port):
            assert "healthcheck" not in service, f"{name}: the image's /healthz check fits"
        else:
            assert service.get("healthcheck"), f"{name}: the image's /healthz check would fail"
    assert "healthcheck" not in services["worker"], "the worker serves /healthz: check it"


# --- Dockerfile -------------------------------------------------------------------------------


def test_the_final_stage_is_slim_python_without_build_tools() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "a build stage and a final stage"
    arguments = dockerfile_arguments()
    base = re.sub(r"\$\{(\w+)\}", lambda m: arguments[m[1]], only(stages[-1], "FROM").arguments)
    assert re.match(r"python:3\.(1[1-9])[.\d]*-slim", base), base
    words = {word for i in stages[-1] if i.keyword == "RUN" for word in i.arguments.split()}
    assert not words & BUILD_TOOLS


def test_the_final_stage_runs_the_cli_as_a_non_root_user() -> None:
    stage = final_stage()
    user = only(stage, "USER").arguments.split(":")[0]
    assert user not in ("root", "0")
    assert only(stage, "ENTRYPOINT").exec_form() == ["telegram-intake"]
    build_parser().parse_args(only(stage, "CMD").exec_form())  # the default is a command
    assert only(stage, "EXPOSE").arguments == image_environment()["INTAKE_PORT"]
    assert image_environment()["INTAKE_HOST"] == "0.0.0.0"


def test_the_healthcheck_asks_healthz_with_the_standard_library() -> None:
    command = only(final_stage(), "HEALTHCHECK").exec_form()
    assert command[:2] == ["python", "-c"]
    assert "/healthz" in command[2]
    assert "urllib.request" in command[2]


def test_the_migrations_and_examples_sit_beside_the_installed_package() -> None:
    """app/store/migrate.py finds alembic.ini and alembic/ in the directory above the `app`
    package: they must land where the wheel is installed (pip --target)."""
    build, final = dockerfile_stages()[0], final_stage()
    runs = " ".join(i.arguments for i in build if i.keyword == "RUN")
    match = re.search(r"pip install .*--target[= ](\S+)", runs)
    assert match, "the build stage installs the wheel with --target"
    target = match[1]
    assert f"--from=build {target} {target}" in [i.arguments for i in final]
    copies = copied(final)
    for source in ("alembic.ini", "alembic", "examples"):
        assert copies.get(source) == posixpath.join(target, source), source
    assert image_environment("PYTHONPATH") == {"PYTHONPATH": target}


def test_dockerignore_keeps_local_state_out_and_what_the_build_copies_in() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for local in (".venv", ".git", "var/", ".pytest_cache", "bench/results"):
        assert local in patterns, local
    sources = [
        source
        for stage in dockerfile_stages()
        for source in copied(stage)
        if not source.startswith("/")
    ]
    needed = {"requirements.lock", "pyproject.toml", "README.md", "kit/python", "app", "alembic"}
    needed.add("examples")
    assert needed <= set(sources)
    for source in sources:
        ignored = [p for p in patterns if fnmatch.fnmatch(source, p.rstrip("/"))]
        assert not ignored, f"{source} is needed by the build but ignored by {ignored}"


def test_the_dependency_layer_installs_the_lock_alone_with_hashes() -> None:
    """The dependencies come from requirements.lock, copied alone before them: the layer is
    rebuilt only when the lock changes, and pip refuses a file whose hash the lock lacks. The
    project's wheel, after them, resolves nothing again."""
    build = dockerfile_stages()[0]
    installs = [
        (index, command.strip())
        for index, instruction in enumerate(build)
        if instruction.keyword == "RUN"
        for command in instruction.arguments.split("&&")
        if command.strip().startswith("pip install")
    ]
    (first, dependencies), *project = installs
    before = [source for i in build[:first] if from_context(i) for source in copy_targets(i, "/")]
    assert before == ["requirements.lock"]
    words = shlex.split(dependencies)
    assert "--require-hashes" in words, dependencies
    workdir = list(in_workdir(build))[first][1]
    lock = posixpath.join(workdir, words[words.index("-r") + 1])
    assert lock == copied(build)["requirements.lock"]
    assert project, "the build stage installs the project's wheel"
    for _, command in project:
        assert "--no-deps" in shlex.split(command), command


# --- the build stage, as plain processes ------------------------------------------------------


CONTAINER_PATH = re.compile(r"(?<![^\s=:])/(?=\w)")  # an absolute path in a command or value


def local_python(version: str) -> str:
    """This machine's interpreter of the Dockerfile's Python (pyenv's too): the base image's.
    A machine without it uses the interpreter running the tests: the lock holds the hashes of
    every file of each pinned release, so it installs on any Python the project supports."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    try:
        found = subprocess.run(
            [f"python{version}", "-c", "import sys; print(sys.executable)"],
            env=os.environ | {"PYENV_VERSION": version},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except FileNotFoundError:
        found = None
    if found is None or found.returncode != 0:
        return sys.executable
    return found.stdout.strip()


class Container:
    """A stage's instructions run as plain processes on this machine: the container's / is
    `root`, and its base image's `python` is the Dockerfile's Python found here."""

    def __init__(self, root: Path) -> None:
        self.root = root
        base = root / "usr/local/bin"
        base.mkdir(parents=True)
        python = local_python(dockerfile_arguments()["PYTHON_VERSION"])
        (base / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
        (base / "python").chmod(0o755)
        self.base = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("INTAKE_", "PYTHON", "VIRTUAL_ENV"))
        } | {"PATH": f"{base}:{os.environ['PATH']}"}

    def local(self, value: str) -> str:
        return CONTAINER_PATH.sub(f"{self.root}/", value)

    def environment(self, stage: list[Instruction]) -> dict[str, str]:
        """The stage's environment: the base image's, then its ENV instructions."""
        env = dict(self.base)
        for instruction in stage:
            if instruction.keyword == "ENV":
                for name, value in declared(instruction).items():
                    value = self.local(value)
                    env[name] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m[1], ""), value)
        return env

    def build(self, stage: list[Instruction]) -> None:
        """Run the stage: its COPY from the checkout, its RUN through /bin/sh, each in its
        WORKDIR and with the ENV declared before it."""
        for index, (instruction, workdir) in enumerate(in_workdir(stage)):
            here = self.root / workdir.lstrip("/")
            if instruction.keyword in ("FROM", "ARG", "ENV"):
                continue
            if instruction.keyword == "WORKDIR":
                here.mkdir(parents=True, exist_ok=True)
            elif from_context(instruction):
                for source, target in copy_targets(instruction, workdir).items():
                    self.copy(ROOT / source, self.root / target.lstrip("/"))
            elif instruction.keyword == "RUN":
                env = self.environment(stage[:index])
                for command in instruction.arguments.split("&&"):
                    self.confined(shlex.split(command)[0], env)
                done = subprocess.run(
                    ["/bin/sh", "-c", self.local(instruction.arguments)],
                    cwd=here, env=env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                assert done.returncode == 0, f"RUN {instruction.arguments}\n{done.stderr}"
            else:
                pytest.fail(f"{instruction.keyword} {instruction.arguments}: not run here yet")

    def confined(self, program: str, env: Mapping[str, str]) -> None:
        """A python or pip of the stage must be the container's: this machine's would install
        into this machine's Python."""
        if program.startswith(("python", "pip")):
            found = shutil.which(program, path=env["PATH"])
            assert found, f"{program}: not on the stage's PATH"
            assert found.startswith(f"{self.root}/"), f"{program} would be this machine's {found}"

    @staticmethod
    def copy(source: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target)


@pytest.mark.slow
@pytest.mark.xdist_group("deployment")  # untimed: not in the serial group
def test_the_build_stage_installs_the_lock_and_the_image_runs_on_it(tmp_path: Path) -> None:
    """The build stage's commands, run here with the Dockerfile's Python: the lock installs
    with its hashes, and in the final stage's environment (the build's virtualenv and /app)
    pip finds every requirement of the wheel met, extras included, and the CLI migrates."""
    container = Container(tmp_path / "root")
    build, final = dockerfile_stages()[0], final_stage()
    container.build(build)

    env = container.environment(final) | {"INTAKE_DATABASE_URL": f"sqlite:///{tmp_path}/i.db"}
    workdir = container.root / list(in_workdir(final))[-1][1].lstrip("/")
    python = shutil.which("python", path=env["PATH"])
    assert python is not None
    assert python.startswith(str(container.root / "opt/venv")), python

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120
        )

    checked = run(python, "-m", "pip", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    version = run(python, "-c", "import sys; print(*sys.version_info[:2], sep='.')")
    assert version.stdout.strip() == dockerfile_arguments()["PYTHON_VERSION"]
    entrypoint = shutil.which(only(final, "ENTRYPOINT").exec_form()[0], path=env["PATH"])
    assert entrypoint is not None, "the ENTRYPOINT is on the image's PATH"
    assert entrypoint.startswith(str(container.root / "app/bin")), entrypoint
    migrated = run(entrypoint, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "database at revision" in migrated.stdout


# --- the sequence, as plain processes ---------------------------------------------------------


VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class Placement:
    """Where the compose services run on this machine: 127.0.0.1, each listening service on a
    free port, the test's database, and the variables compose would interpolate."""

    def __init__(self, services: dict[str, dict[str, Any]], url: str) -> None:
        self.services = services
        self.url = url
        self.ports = {
            (name, container_port(service)): free_port()
            for name, service in services.items()
            if name in IMAGE_SERVICES and ("ports" in service or "expose" in service)
        }
        signing_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        self.variables = {
            "POSTGRES_PASSWORD": "unused-here",
            "INTAKE_SECRET_TOKEN": SECRET,
            "INTAKE_API_KEYS": secrets.token_urlsafe(24),
            "INTAKE_SIGNING_SECRET": signing_secret,
        }

    def local_port(self, name: str) -> int:
        return self.ports[(name, container_port(self.services[name]))]

    def localise(self, name: str, value: str) -> str:
        value = VARIABLE.sub(self._variable, value).replace("0.0.0.0", "127.0.0.1")
        for (service, port), local in self.ports.items():
            value = value.replace(f"//{service}:{port}", f"//127.0.0.1:{local}")
            if service == name and value in (str(port), f"--port={port}"):
                value = value.replace(str(port), str(local))
        return value

    def _variable(self, match: re.Match[str]) -> str:
        given = self.variables.get(match["name"])
        if match["op"] in ("?", ":?") and not given:
            pytest.fail(f"compose would refuse to start without {match['name']}")
        return given or (match["arg"] if match["op"] in ("-", ":-") else "")

    def command(self, name: str) -> list[str]:
        return [self.localise(name, word) for word in self.services[name]["command"]]

    def environment(self, name: str) -> dict[str, str]:
        """This machine's environment without its INTAKE_*, then the image's and the
        service's INTAKE_* settings, localised."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
        env["PYTHONUNBUFFERED"] = "1"
        settings = image_environment() | self.services[name]["environment"]
        for variable, value in settings.items():
            if variable.startswith("INTAKE_"):
                env[variable] = self.localise(name, str(value))
        env["INTAKE_DATABASE_URL"] = self.url
        return env


def healthcheck(env: Mapping[str, str]) -> int:
    """Run the image's HEALTHCHECK command here; its exit code."""
    _python, *arguments = only(final_stage(), "HEALTHCHECK").exec_form()
    done = subprocess.run(
        [sys.executable, *arguments], env=dict(env), capture_output=True, timeout=10
    )
    return done.returncode


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def assert_clean(*started: Process) -> None:
    for process in started:
        assert process.poll() is None, process.report()
        assert "Traceback" not in process.stderr, process.report()
        assert not re.search(r'[ "]ERROR[ "]', process.stderr), process.report()  # text or JSON


def logged(process: Process, *words: str) -> bool:
    """A line of the process's log holds all these words (text or JSON lines alike)."""
    return any(all(word in line for word in words) for line in process.stderr.splitlines())


@pytest.mark.slow
async def test_the_compose_sequence_delivers_an_update_as_plain_processes(
    postgres_storage: Storage, tmp_path: Path
) -> None:
    place = Placement(compose_services(), postgres_storage.url(revision=None))
    with processes(tmp_path) as start:
        migrate = start("migrate", place.environment("migrate"), *place.command("migrate"))
        assert await asyncio.to_thread(migrate.popen.wait, STARTUP) == 0, migrate.report()
        assert "database at revision" in migrate.stdout, migrate.report()

        running = {
            name: start(name, place.environment(name), *place.command(name))
            for name in ("intake", "worker", "downstream")
        }
        intake_env = place.environment("intake")

        async def healthy() -> bool:
            assert running["intake"].poll() is None, running["intake"].report()
            return await asyncio.to_thread(healthcheck, intake_env) == 0

        await eventually(healthy, within=STARTUP)
        await eventually(running["worker"].started, within=STARTUP)
        worker_env = place.environment("worker")
        # The image's healthcheck, run with the worker's settings, finds the worker healthy.
        assert await asyncio.to_thread(healthcheck, worker_env) == 0, running["worker"].report()
        await eventually(lambda: accepts(place.local_port("downstream")), within=STARTUP)
        # The check can fail: nothing listens on this port.
        assert await asyncio.to_thread(healthcheck, {**intake_env, "INTAKE_PORT": str(free_port())})

        webhook = f"http://127.0.0.1:{place.local_port('intake')}/telegram/default"
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(webhook, content=message(701, chat=77), headers=headers)
        assert response.status_code == 200, response.text

        # The demo downstream logs an update only after the intake's callback API confirmed
        # that this attempt owns it.
        downstream = running["downstream"]
        await eventually(lambda: logged(downstream, "handled", "default:701"), within=15)
        await eventually(
            lambda: table_rows(place.url, "state", "attempts") == [("completed", 1)], within=15
        )
        assert_clean(*running.values())
