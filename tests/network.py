"""A network namespace the tests make themselves, joined to this machine by veth pairs that a
test can cut and heal, for what crosses a network (a worker cut off from its database).

Each `Link` is one veth pair: a /30 of 10.213.0.0/16, the host's end `.1`, the namespace's
`.2`. `cut` takes the host's end down; what the namespace sends over the link is then
dropped without a word, as in a partition: the namespace keeps its route and a permanent
neighbour entry for the host's address, so no "unreachable" comes back, and the host's
packets for the namespace fall on a blackhole route of low priority rather than the
machine's default route. `heal` brings the end up again. Traffic stays on this machine.

Needs root and iproute2 (`ip`); `namespace` raises `NetworkUnavailable` without either.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")


class NetworkUnavailable(RuntimeError):
    """No namespaces here: not root, or no `ip`."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetworkUnavailable(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass(frozen=True)
class Link:
    """One veth pair between this machine and the namespace."""

    host_device: str
    host_address: str  # the host's end: listen here to be reachable from the namespace
    namespace_address: str

    def cut(self) -> None:
        _ip("link", "set", self.host_device, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_device, "up")


@dataclass
class Namespace:
    name: str
    _stack: ExitStack
    _links: int = 0

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside the namespace (`ip netns exec` replaces itself with it)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def link(self) -> Link:
        """A new veth pair, up, on a /30 no other link of this machine uses."""
        self._links += 1
        token = self.name.removeprefix("intake-")
        host_device = f"it{token}h{self._links}"  # at most 15 characters
        inside = f"it{token}n{self._links}"
        network = _free_subnet()
        host, namespace = (str(address) for address in network.hosts())
        _ip("link", "add", host_device, "type", "veth", "peer", "name", inside)
        self._stack.callback(_quietly, "link", "del", host_device)
        _ip("link", "set", inside, "netns", self.name)
        _ip("addr", "add", f"{host}/30", "dev", host_device)
        _ip("link", "set", host_device, "up")
        _ip("-n", self.name, "addr", "add", f"{namespace}/30", "dev", inside)
        _ip("-n", self.name, "link", "set", inside, "up")
        mac = Path(f"/sys/class/net/{host_device}/address").read_text().strip()
        # Silence, not "unreachable", once cut: the namespace never asks who has the host's
        # address again, and the host's own packets for the namespace go nowhere.
        _ip("-n", self.name, "neigh", "replace", host, "lladdr", mac, "dev", inside,
            "nud", "permanent")  # fmt: skip
        _ip("route", "add", "blackhole", str(network), "metric", "4000")
        self._stack.callback(_quietly, "route", "del", "blackhole", str(network), "metric", "4000")
        return Link(host_device, host, namespace)


def _free_subnet() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    while True:
        network = random.choice(list(SUBNETS.subnets(new_prefix=30)))
        if str(next(network.hosts())) not in used:
            return network


def _quietly(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, timeout=30)


@contextmanager
def namespace() -> Iterator[Namespace]:
    """A new network namespace with its loopback up; it and its links go at the end."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NetworkUnavailable("network namespaces need root and iproute2's ip")
    name = f"intake-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        _ip("netns", "add", name)
        stack.callback(_quietly, "netns", "del", name)
        _ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name, stack)
