"""nsqlookupd's registration database (Go: nsqlookupd/registration_db.go).

A registration is a key ``(category, key, subkey)``: ``("client", "", "")`` for every identified
nsqd, ``("topic", T, "")`` and ``("channel", T, C)``. Each maps to the producers (nsqd peers)
registered under it, by peer id (the peer's remote address). Keys survive their last producer,
so topics and channels stay listed until deleted.

Beyond Go's single map we keep indexes so that the common questions need no full scan:
category -> key -> subkeys (for ``*`` wildcards), peer id -> its registrations (for disconnects
and ``/nodes``) and peer id -> topic -> its channels there (so that a peer's topic UNREGISTER
costs what that peer registered under the topic, not every channel the topic ever had). Every
change costs O(1). The database is plain data: time is passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Registration = tuple[str, str, str]

WILDCARD = "*"

#: ``time.Time{}.UnixNano()`` in Go: what ``/debug`` shows for a producer never tombstoned.
GO_ZERO_TIME_NS = -6795364578871345152


class PeerInfo:
    """An identified nsqd. Shared by all its producer records, so a PING refreshes them all."""

    __slots__ = (
        "broadcast_address",
        "hostname",
        "http_port",
        "id",
        "last_update",
        "remote_address",
        "tcp_port",
        "version",
    )

    def __init__(
        self,
        id: str,
        remote_address: str = "",
        hostname: str = "",
        broadcast_address: str = "",
        tcp_port: int = 0,
        http_port: int = 0,
        version: str = "",
        last_update: float = 0.0,
    ) -> None:
        self.id = id
        self.remote_address = remote_address
        self.hostname = hostname
        self.broadcast_address = broadcast_address
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.version = version
        self.last_update = last_update

    def to_json(self) -> dict[str, Any]:
        """The shape ``/lookup`` returns (struct field order of Go's PeerInfo)."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }

    @property
    def http_node(self) -> str:
        """``"%s:%d"`` of broadcast address and HTTP port: how ``/topic/tombstone`` names it."""
        return f"{self.broadcast_address}:{self.http_port}"

    def __repr__(self) -> str:
        return f"{self.broadcast_address} [{self.tcp_port}, {self.http_port}]"


class Producer:
    """One peer's record under one registration; a tombstone lives on the record."""

    __slots__ = ("peer", "tombstoned", "tombstoned_at")

    def __init__(self, peer: PeerInfo) -> None:
        self.peer = peer
        self.tombstoned = False
        self.tombstoned_at: float | None = None

    def tombstone(self, now: float) -> None:
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, lifetime: float, now: float) -> bool:
        at = self.tombstoned_at
        return self.tombstoned and at is not None and now - at < lifetime

    def __repr__(self) -> str:
        return f"Producer({self.peer!r}, tombstoned={self.tombstoned})"


def filter_active(
    producers: Iterable[Producer], inactivity_timeout: float, tombstone_lifetime: float, now: float
) -> list[Producer]:
    """Producers heard from within ``inactivity_timeout`` and not currently tombstoned."""
    return [
        p
        for p in producers
        if now - p.peer.last_update <= inactivity_timeout
        and not p.is_tombstoned(tombstone_lifetime, now)
    ]


def matches(registration: Registration, category: str, key: str, subkey: str) -> bool:
    """Go's ``Registration.IsMatch``: the category exactly, key and subkey exactly or ``*``."""
    reg_category, reg_key, reg_subkey = registration
    return (
        reg_category == category
        and (key == WILDCARD or reg_key == key)
        and (subkey == WILDCARD or reg_subkey == subkey)
    )


class RegistrationDB:
    __slots__ = ("_by_category", "_by_peer", "_peer_channels", "_producers")

    def __init__(self) -> None:
        self._producers: dict[Registration, dict[str, Producer]] = {}
        # category -> key -> subkeys; dicts used as insertion-ordered sets
        self._by_category: dict[str, dict[str, dict[str, None]]] = {}
        self._by_peer: dict[str, dict[Registration, None]] = {}
        # peer id -> topic -> channels the peer produces there
        self._peer_channels: dict[str, dict[str, dict[str, None]]] = {}

    def __len__(self) -> int:
        return len(self._producers)

    # ------------------------------------------------------------------ changes

    def add_registration(self, registration: Registration) -> None:
        """Make sure the key exists (with no producers if it is new)."""
        if registration not in self._producers:
            self._producers[registration] = {}
            category, key, subkey = registration
            self._by_category.setdefault(category, {}).setdefault(key, {})[subkey] = None

    def add_producer(self, registration: Registration, producer: Producer) -> bool:
        """Add ``producer`` unless its peer is already there (the old record, and any tombstone
        on it, is kept). Returns True if it was added."""
        self.add_registration(registration)
        producers = self._producers[registration]
        peer_id = producer.peer.id
        if peer_id in producers:
            return False
        producers[peer_id] = producer
        self._by_peer.setdefault(peer_id, {})[registration] = None
        category, key, subkey = registration
        if category == "channel":
            self._peer_channels.setdefault(peer_id, {}).setdefault(key, {})[subkey] = None
        return True

    def remove_producer(self, registration: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove the peer from one key, which stays. Returns (removed, producers left)."""
        producers = self._producers.get(registration)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._forget_peer_registration(peer_id, registration)
        return removed, len(producers)

    def remove_registration(self, registration: Registration) -> None:
        """Delete the key and every producer record under it."""
        producers = self._producers.pop(registration, None)
        if producers is None:
            return
        for peer_id in producers:
            self._forget_peer_registration(peer_id, registration)
        category, key, subkey = registration
        keys = self._by_category[category]
        subkeys = keys[key]
        del subkeys[subkey]
        if not subkeys:
            del keys[key]
            if not keys:
                del self._by_category[category]

    def _forget_peer_registration(self, peer_id: str, registration: Registration) -> None:
        registrations = self._by_peer.get(peer_id)
        if registrations is not None:
            registrations.pop(registration, None)
            if not registrations:
                del self._by_peer[peer_id]
        category, key, subkey = registration
        if category != "channel":
            return
        topics = self._peer_channels.get(peer_id)
        channels = None if topics is None else topics.get(key)
        if topics is None or channels is None:
            return
        channels.pop(subkey, None)
        if not channels:
            del topics[key]
            if not topics:
                del self._peer_channels[peer_id]

    # ------------------------------------------------------------------ queries

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """Existing keys matching, with ``*`` as a wildcard for key and/or subkey."""
        if key != WILDCARD and subkey != WILDCARD:
            registration = (category, key, subkey)
            return [registration] if registration in self._producers else []
        keys = self._by_category.get(category)
        if not keys:
            return []
        if key != WILDCARD:
            subkeys = keys.get(key)
            return [(category, key, s) for s in subkeys] if subkeys else []
        if subkey != WILDCARD:
            return [(category, k, subkey) for k, subkeys in keys.items() if subkey in subkeys]
        return [(category, k, s) for k, subkeys in keys.items() for s in subkeys]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers of the matching keys; with wildcards, one record per peer (the first)."""
        if key != WILDCARD and subkey != WILDCARD:
            return list(self._producers.get((category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for registration in self.find_registrations(category, key, subkey):
            for peer_id, producer in self._producers[registration].items():
                seen.setdefault(peer_id, producer)
        return list(seen.values())

    def producer(self, registration: Registration, peer_id: str) -> Producer | None:
        producers = self._producers.get(registration)
        return None if producers is None else producers.get(peer_id)

    def peer_channels(self, peer_id: str, topic: str) -> list[Registration]:
        """The channel keys under ``topic`` the peer is a producer of."""
        channels = self._peer_channels.get(peer_id, {}).get(topic, ())
        return [("channel", topic, channel) for channel in channels]

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key the peer is a producer of."""
        return list(self._by_peer.get(peer_id, ()))

    def keys(self, category: str) -> list[str]:
        """The distinct keys of a category (``/topics``)."""
        return list(self._by_category.get(category, ()))

    def subkeys(self, category: str, key: str) -> list[str]:
        """The subkeys under one key (``/channels``)."""
        return list(self._by_category.get(category, {}).get(key, ()))

    def items(self) -> list[tuple[Registration, list[Producer]]]:
        """Every key with its producers (``/debug``)."""
        return [(r, list(p.values())) for r, p in self._producers.items()]
