"""set-webhook's checks of what it sends, made as Telegram's Bot API server would make them
(tdlib/telegram-bot-api, Client.cpp and WebhookActor.cpp at 01a3679) before anything is sent:
Telegram's own server (https://api.telegram.org) takes an https:// URL on port 443, 80, 88 or
8443 and an ip_address that is IPv4 and not reserved; a local Bot API server (any other
bot_api_url) takes http://, any port and any valid address. The certificate is read here, up to
Telegram's 3 MiB. max_connections and allowed_updates are checked as the settings check them
(`app.webhook_rules`); a notice says when the list Telegram keeps leaves out an opt-in type
(app.queues.OPT_IN)."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from app.queues import DEFAULT_UPDATES, OPT_IN
from app.webhook_rules import MAX_CERTIFICATE_BYTES, OFFICIAL_BOT_API_URL

# Telegram's checks of a webhook with its own server (WebhookActor.cpp, start_up and
# check_ip_address; td's IPAddress::is_reserved for the blocks).
OFFICIAL_PORTS = (443, 80, 88, 8443)
RESERVED_IPV4 = tuple(
    ipaddress.IPv4Network(block)
    for block in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
        "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/3",
    )
)  # fmt: skip


def url_problems(url: str, local: bool) -> list[str]:
    """What Telegram would refuse in a webhook URL: its own server takes https:// on port 443,
    80, 88 or 8443 only (no port: 443); a local server also http:// and any port."""
    schemes = ("https", "http") if local else ("https",)
    server = (
        "a local Bot API server" if local else f"Telegram's Bot API server ({OFFICIAL_BOT_API_URL})"
    )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return [f"--url {url!r} is not a URL"]
    if parts.scheme.lower() not in schemes or not parts.hostname:
        wanted = " or ".join(f"{scheme}://" for scheme in schemes)
        more = "" if local else "; http:// only with a local Bot API server as bot_api_url"
        return [f"--url {url!r}: {server} takes a URL that starts with {wanted}{more}"]
    if not local and (443 if port is None else port) not in OFFICIAL_PORTS:
        return [
            f"--url {url!r}: {server} delivers to ports 443, 80, 88 or 8443 only, not {port}; "
            "any port only with a local Bot API server as bot_api_url"
        ]
    return []


def ip_address_problems(value: str, local: bool) -> list[str]:
    """What Telegram would refuse as ip_address: not an address; with its own server, an IPv6
    address or a reserved IPv4 one (private, loopback, link-local, shared, documentation,
    multicast...)."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return [f"--ip-address {value!r} is not an IP address"]
    if local:
        return []
    more = "; any address only with a local Bot API server as bot_api_url"
    if not isinstance(address, ipaddress.IPv4Address):
        return [
            f"--ip-address {value}: Telegram's Bot API server takes IPv4 only (its words: "
            f'"IPv6-only addresses are not allowed"){more}'
        ]
    block = next((block for block in RESERVED_IPV4 if address in block), None)
    if block is not None:
        return [
            f"--ip-address {value} is in {block}, not reachable on the Internet: Telegram's "
            f'Bot API server refuses it ("IP address {value} is reserved"){more}'
        ]
    return []


def read_certificate(path: str) -> tuple[bytes, str | None]:
    """The certificate file's content, or why it cannot be sent: unreadable, empty, or over
    Telegram's 3 MiB."""
    try:
        with open(path, "rb") as file:
            content = file.read(MAX_CERTIFICATE_BYTES + 1)
            size = max(len(content), os.fstat(file.fileno()).st_size)
    except OSError as error:
        return b"", f"--certificate {path}: cannot be read ({error.strerror or error})"
    if size > MAX_CERTIFICATE_BYTES:
        return b"", (
            f"--certificate {path}: {size} bytes, over the {MAX_CERTIFICATE_BYTES} bytes "
            "(3 MiB) Telegram takes"
        )
    if not content:
        return b"", f"--certificate {path}: the file is empty"
    return content, None


def opt_in_notice(registered: list[str] | None) -> str | None:
    """A notice when the allowed_updates Telegram now keeps (getWebhookInfo's; none: its
    default) leave out update types it sends only to a bot that names them."""
    keeps = registered or list(DEFAULT_UPDATES)
    left_out = [name for name in OPT_IN if name not in keeps]
    if not left_out:
        return None
    named = ", ".join(left_out)
    if not registered:
        return (
            f"notice: Telegram's default allowed_updates apply, which leave out {named}: "
            "Telegram sends these only to a bot that names them. To receive them, name every "
            "update type wanted, these included, in --allowed-updates (or the bot's "
            "allowed_updates)."
        )
    return (
        f"notice: allowed_updates leave out {named}: Telegram sends these only to a bot that "
        "names them. To receive them, name them too: --allowed-updates "
        + ",".join([*registered, *left_out])
    )
