"""Child processes for the benchmarks: a free port, a process started and stopped, and the
CPU time of a child or of the whole PostgreSQL cluster."""

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

import psycopg

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
        return _cpu_seconds(_stat(self.pid))


@dataclass(frozen=True)
class Cluster:
    """A PostgreSQL cluster running on this machine, by its postmaster's pid."""

    postmaster: int

    @classmethod
    def serving(cls, url: str) -> Cluster:
        """The cluster behind the libpq `url`: its data directory's postmaster.pid names the
        postmaster (this process must be allowed to read the data directory)."""
        with psycopg.connect(url) as connection:
            row = connection.execute("SHOW data_directory").fetchone()
        assert row is not None
        return cls(int(Path(row[0], "postmaster.pid").read_text().split()[0]))

    def cpu_seconds(self) -> float:
        """CPU time the whole cluster has used so far, user and system: the postmaster's own,
        its live children's (backends, autovacuum, WAL writer, checkpointer...) and its reaped
        children's (the postmaster's cutime and cstime). Other clients of the cluster count
        too. A child reaped after the postmaster is read and before it is read is missed."""
        postmaster = _stat(self.postmaster)
        seconds = _cpu_seconds(postmaster) + _cpu_seconds(postmaster, reaped=True)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = _stat(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):  # it has gone since the listing
                continue
            if int(fields[1]) == self.postmaster:
                seconds += _cpu_seconds(fields)
        return seconds


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the process's name (which may hold spaces): the
    state first, then the parent's pid, and so on (proc(5)'s field 3 is index 0)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _cpu_seconds(fields: list[str], *, reaped: bool = False) -> float:
    """User and system time from `_stat`'s fields: the process's own (utime, stime), or with
    `reaped` its waited-for children's (cutime, cstime)."""
    user = 13 if reaped else 11
    return (int(fields[user]) + int(fields[user + 1])) / os.sysconf("SC_CLK_TCK")


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
