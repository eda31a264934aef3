"""Where a webhook request came from, and whether that source may post updates.

The peer address is the request's source unless the peer is a trusted proxy: then the
nearest address in `X-Forwarded-For` that is not itself a trusted proxy (read from the right,
as each proxy appends the address it saw). Headers from untrusted peers are never read, so a
client cannot claim to be Telegram.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str | None) -> Address | None:
    try:
        address = ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
    # A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d; the allowlist names a.b.c.d.
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def _within(address: Address, networks: Sequence[Network]) -> bool:
    return any(address in network for network in networks)


def client_address(
    peer: str | None, forwarded_for: str | None, trusted_proxies: Sequence[Network]
) -> Address | None:
    """The request's source address; None when it cannot be told."""
    address = _address(peer)
    if address is None or not forwarded_for or not _within(address, trusted_proxies):
        return address
    for hop in reversed(forwarded_for.split(",")):
        address = _address(hop)
        if address is None or not _within(address, trusted_proxies):
            return address
    return address


def source_allowed(address: Address | None, allowed: Sequence[Network]) -> bool:
    """No allowlist admits every source; otherwise the address must be inside it."""
    return not allowed or (address is not None and _within(address, allowed))


def came_over_https(
    scheme: str, peer: str | None, forwarded_proto: str | None, trusted_proxies: Sequence[Network]
) -> bool:
    """Whether the client's request came over HTTPS: to this server, or to a trusted proxy
    that says so in `X-Forwarded-Proto` (the last hop's word; others' are never read)."""
    if scheme == "https":
        return True
    address = _address(peer)
    if address is None or not forwarded_proto or not _within(address, trusted_proxies):
        return False
    return forwarded_proto.split(",")[-1].strip().lower() == "https"
