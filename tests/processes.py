"""Real child processes for tests about processes: `python -m <module> ...` with an explicit
environment, its stdout and stderr in files under tmp_path (printed when a check fails),
killed at the end whatever happens."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

SECRET = "process-secret"
STARTUP = 30.0  # a cold interpreter importing the app, on a loaded machine
ROOT = Path(__file__).resolve().parent.parent  # the repository: `examples` imports from here


class Process:
    """One `python -m app.cli ...` child (or `python -m <module>`, or any `program`), its
    stdout and stderr in files."""

    def __init__(
        self,
        name: str,
        tmp_path: Path,
        env: dict[str, str],
        *args: str,
        module: str = "app.cli",
        program: list[str] | None = None,
    ) -> None:
        self.name = name
        self.stdout_path = tmp_path / f"{name}.stdout"
        self.stderr_path = tmp_path / f"{name}.stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.popen = subprocess.Popen(
                [*(program or [sys.executable, "-m", module]), *args],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal(self, number: int) -> None:
        os.kill(self.popen.pid, number)

    def started(self) -> bool:
        """The worker logged that its dispatcher is running (fails fast if it died)."""
        code = self.popen.poll()
        assert code is None, f"{self.name} exited with {code}\n{self.report()}"
        return "worker started" in self.stderr

    def answers(self, url: str) -> bool:
        """GET `url` answers 200 (fails fast if the process died)."""
        code = self.popen.poll()
        assert code is None, f"{self.name} exited with {code}\n{self.report()}"
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def report(self) -> str:
        return (
            f"--- {self.name} (pid {self.pid}, exit {self.popen.poll()}) stdout:\n{self.stdout}"
            f"--- {self.name} stderr:\n{self.stderr}"
        )

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=15)


@contextmanager
def processes(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Start processes with `start(name, env, *args)`; every one is killed at the end, and a
    failing test prints what each one wrote."""
    started: list[Process] = []

    def start(
        name: str,
        env: dict[str, str],
        *args: str,
        module: str = "app.cli",
        program: list[str] | None = None,
    ) -> Process:
        process = Process(name, tmp_path, env, *args, module=module, program=program)
        started.append(process)
        return process

    try:
        yield start
    except BaseException:
        for process in started:
            process.kill()
            print(process.report())
        raise
    finally:
        for process in started:
            process.kill()


def environment(url: str, downstream_url: str | None, **options: object) -> dict[str, str]:
    """The child's environment: this one's, plus the INTAKE_* settings given."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("INTAKE_")}
    env |= {
        "INTAKE_DATABASE_URL": url,
        "INTAKE_SECRET_TOKEN": SECRET,
        "INTAKE_POLL_INTERVAL_SECONDS": "0.2",
        "INTAKE_RETRY_BASE_SECONDS": "0.05",
        "INTAKE_RETRY_CAP_SECONDS": "0.2",
        "INTAKE_SHUTDOWN_GRACE_SECONDS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if downstream_url is not None:
        env["INTAKE_DOWNSTREAM_URL"] = downstream_url
    env |= {f"INTAKE_{name.upper()}": str(value) for name, value in options.items()}
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def until_listening(port: int, process: Process) -> None:
    """Until `process` accepts connections on `port` (fails fast if it died)."""
    deadline = time.monotonic() + STARTUP
    while True:
        assert process.poll() is None, process.report()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"not listening within {STARTUP} s"
            time.sleep(0.05)


async def until_serving(client: httpx.AsyncClient, port: int, serve: Process) -> None:
    """Until `serve` answers /healthz on `port` (fails fast if it died)."""
    deadline = time.monotonic() + STARTUP
    while True:
        assert serve.poll() is None, serve.report()
        try:
            if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{serve.name} not serving within {STARTUP} s"
        await asyncio.sleep(0.05)


async def post_update(
    client: httpx.AsyncClient, port: int, body: str, bot: str = "default"
) -> None:
    """POST one update to `serve` on `port` as Telegram does; it must answer 200."""
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    answer = await client.post(
        f"http://127.0.0.1:{port}/telegram/{bot}", content=body, headers=headers
    )
    assert answer.status_code == 200, answer.text


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Something a test needs from outside Python is missing (a binary, Node): the test fails
    under CI (`CI=true`, which .ci/run sets) and skips elsewhere, saying why."""
    if under_ci():
        pytest.fail(f"{reason}; CI must run this test", pytrace=False)
    pytest.skip(reason)
