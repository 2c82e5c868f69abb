"""Pool addresses: one HOST:PORT, a comma list of them (client-side round-robin), or one dns:///NAME:PORT name."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from client.errors import InvalidArgumentError

DNS_SCHEME = "dns:///"
# a host name as DNS and gRPC take it (letters, digits, '-', '_', '.'), or an IPv4 address
_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_ENTRY = re.compile(r"^(?:\[(?P<ipv6>[^\]]*)\]|(?P<host>[^:\[\]]*)):(?P<port>[^:]*)$")
# what the help texts show, and what every error below ends with
SYNTAX = "HOST:PORT, a comma list HOST1:PORT1,HOST2:PORT2 or dns:///NAME:PORT"


@dataclass(frozen=True)
class PoolAddresses:
    """What one pool address string names: ``hosts`` (HOST:PORT each, as given) or one ``dns`` target (dns:///NAME:PORT).

    Pools are stateless over one store, so any of them serves any call: a client rotates over ``hosts`` itself, and leaves
    a ``dns`` name to gRPC's round_robin policy (which re-resolves it).
    """

    text: str
    hosts: tuple[str, ...] = ()
    dns: str | None = None
    dns_host: str = ""
    dns_port: int = 0

    @property
    def targets(self) -> tuple[str, ...]:
        """What gRPC dials: each HOST:PORT, or the dns:/// target."""
        return (self.dns,) if self.dns is not None else self.hosts

    def host_names(self) -> tuple[str, ...]:
        """The host of each address (IPv6 without brackets), e.g. to decide whether a token may travel in plaintext."""
        if self.dns is not None:
            return (self.dns_host,)
        return tuple(split_host_port(h)[0] for h in self.hosts)

    def describe(self) -> str:
        """The addresses as errors name them: 'h1:p1, h2:p2 and h3:p3', or the dns:/// target."""
        return join_names(self.targets)


def join_names(names: tuple[str, ...] | list[str], conjunction: str = "and") -> str:
    """'a', 'a and b', 'a, b and c'."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {conjunction} {names[-1]}"


def split_host_port(address: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT that parse_pool_addresses accepted (an IPv6 host without its brackets)."""
    m = _ENTRY.match(address)
    assert m is not None, address
    return (m.group("ipv6") if m.group("ipv6") is not None else m.group("host")), int(m.group("port"))


def _bad(text: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"pool address {text!r}: {why}; give {SYNTAX}")


def _host_port(text: str, entry: str, what: str) -> tuple[str, int]:
    """(host, port) of one HOST:PORT entry, or InvalidArgumentError naming the entry and what is wrong with it."""
    if entry.lower().startswith("dns:"):
        raise _bad(text, f"mixed forms: {what} {entry!r} is a dns:/// name, which stands alone, never in a comma list")
    if "://" in entry:
        raise _bad(text, f"{what} {entry!r} is not HOST:PORT (an address takes no scheme)")
    m = _ENTRY.match(entry)
    if m is None:
        if entry.count(":") > 1 and not entry.startswith("["):
            raise _bad(text, f"{what} {entry!r}: an IPv6 address goes in brackets, e.g. [::1]:7420")
        raise _bad(text, f"{what} {entry!r} has no port")
    port_text = m.group("port")
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _bad(text, f"{what} {entry!r} has a bad port {port_text!r} (a pool's port is 1..65535)")
    if m.group("ipv6") is not None:
        try:
            ipaddress.IPv6Address(m.group("ipv6"))
        except ValueError:
            raise _bad(text, f"{what} {entry!r}: {m.group('ipv6')!r} in brackets is not an IPv6 address") from None
        return m.group("ipv6"), int(port_text)
    host = m.group("host")
    if not host:
        raise _bad(text, f"{what} {entry!r} has no host")
    if not _HOST_NAME.match(host):
        raise _bad(text, f"{what} {entry!r}: {host!r} is not a host name or IPv4 address")
    return host, int(port_text)


def parse_pool_addresses(text: object) -> PoolAddresses:
    """The pool(s) an address string names; InvalidArgumentError naming the address and the bad entry otherwise.

    ``HOST:PORT`` (an IPv6 host in brackets), a comma list of them (no empty entry, none twice, one form only), or
    ``dns:///NAME:PORT``, which stands alone.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(f"pool address must be a non-empty string ({SYNTAX}), got {text!r}")
    if any(c.isspace() for c in text.strip()) and "," not in text:
        raise _bad(text, "it contains whitespace")
    stripped = text.strip()
    if stripped.lower().startswith("dns:"):
        if "," in stripped:
            raise _bad(text, "a dns:/// name stands alone: mixed forms in one list")
        if not stripped.lower().startswith(DNS_SCHEME):
            if stripped.lower().startswith("dns://"):
                raise _bad(text, "a DNS server (dns://SERVER/NAME:PORT) cannot be given: write dns:///NAME:PORT (three slashes)")
            raise _bad(text, "write the DNS form with three slashes, dns:///NAME:PORT")
        host, port = _host_port(text, stripped[len(DNS_SCHEME) :], "name")
        if ":" in host:  # an IPv6 address is no name to resolve
            raise _bad(text, "dns:/// takes a name, not an IPv6 address: list [ADDR]:PORT entries instead")
        return PoolAddresses(text, dns=f"{DNS_SCHEME}{host}:{port}", dns_host=host, dns_port=port)
    entries = text.split(",")
    hosts: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for i, raw in enumerate(entries, 1):
        entry = raw.strip()
        if not entry:
            raise _bad(text, f"entry {i} of {len(entries)} is empty")
        if any(c.isspace() for c in entry):
            raise _bad(text, f"entry {entry!r} contains whitespace")
        what = "entry" if len(entries) > 1 else "address"
        host, port = _host_port(text, entry, what)
        key = (host.lower() if ":" not in host else ipaddress.IPv6Address(host).compressed, port)
        if key in seen:
            raise _bad(text, f"{entry!r} is listed twice (as {seen[key]!r} before)")
        seen[key] = entry
        hosts.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return PoolAddresses(text, hosts=tuple(hosts))
