"""Child processes for the benchmarks: a free port, and a process started and stopped."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Child:
    """A started child: the first line of its output holding `ready`, and its pid."""

    line: str
    pid: int

    def peak_rss_mib(self) -> float:
        """The child's peak resident set so far (its high-water mark, VmHWM), MiB."""
        return self._status_mib("VmHWM")

    def rss_mib(self) -> float:
        """The child's resident set now (VmRSS), MiB."""
        return self._status_mib("VmRSS")

    def _status_mib(self, name: str) -> float:
        with open(f"/proc/{self.pid}/status") as status:
            for field in status:
                if field.startswith(f"{name}:"):
                    return int(field.split()[1]) / 1024
        raise RuntimeError(f"no {name} for process {self.pid}")

    def cpu_seconds(self) -> float:
        """CPU time the child has used so far, user and system."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The peak RSS (MiB) of every child a benchmark ran, by label, the highest of each label:
# `python -m bench` prints them under each benchmark's tables, with its own process's.
PEAKS: dict[str, float] = {}


def own_peak_rss_mib() -> float:
    """This process's peak resident set, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peaks_line() -> str:
    """The peak RSS of this process and of the children run since the last call."""
    children = "".join(f"; {label} {mib:.0f}" for label, mib in sorted(PEAKS.items()))
    PEAKS.clear()
    return f"Peak RSS, MiB: the benchmark's own process {own_peak_rss_mib():.0f}{children}."


@asynccontextmanager
async def process(
    *command: str,
    env: dict[str, str] | None = None,
    ready: str = "",
    merge_stderr: bool = True,
    label: str | None = None,
) -> AsyncIterator[Child]:
    """A child process in the project's root; yields it once the first line of its output
    holds `ready` (at once when `ready` is empty). SIGTERM on exit, SIGKILL after 30 s. With
    `label`, its peak RSS goes into PEAKS when it stops."""
    child = await asyncio.create_subprocess_exec(
        *command,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else None,
    )
    drain: asyncio.Task[bytes] | None = None
    try:
        assert child.stdout is not None
        seen: list[bytes] = []
        line = b""
        async with asyncio.timeout(60):
            while ready and ready.encode() not in line:
                line = await child.stdout.readline()
                if not line:
                    output = b"".join(seen[-20:]).decode(errors="replace")
                    raise RuntimeError(f"{command} exited before it was ready:\n{output}")
                seen.append(line)
        drain = asyncio.create_task(child.stdout.read())  # never let its pipe fill
        yield Child(line.decode().strip(), child.pid)
    finally:
        if label is not None and child.returncode is None:
            try:
                peak = Child("", child.pid).peak_rss_mib()
            except RuntimeError:  # it has exited, unreaped: nothing to read
                peak = 0.0
            PEAKS[label] = max(peak, PEAKS.get(label, 0.0))
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
        if drain is not None:
            drain.cancel()
