"""RegistrationDB: keys, producers, wildcards, tombstones and activity (Go:
nsqlookupd/registration_db_test.go plus the index bookkeeping we add)."""

from __future__ import annotations

from nsqpy.nsqlookupd.registration_db import (
    PeerInfo,
    Producer,
    RegistrationDB,
    filter_active,
    matches,
)


def peer(n: int, last_update: float = 100.0) -> PeerInfo:
    return PeerInfo(
        id=f"127.0.0.1:{n}",
        remote_address=f"127.0.0.1:{n}",
        hostname=f"host{n}",
        broadcast_address=f"10.0.0.{n}",
        tcp_port=4150,
        http_port=4151 + n,
        version="1.3.0",
        last_update=last_update,
    )


def test_add_producer_creates_key_and_keeps_the_first_record():
    db = RegistrationDB()
    p1 = peer(1)
    first = Producer(p1)
    assert db.add_producer(("topic", "a", ""), first)
    first.tombstone(5.0)
    # a re-REGISTER of the same peer keeps the existing record and its tombstone
    assert not db.add_producer(("topic", "a", ""), Producer(p1))
    [record] = db.find_producers("topic", "a", "")
    assert record is first and record.tombstoned


def test_remove_producer_keeps_key():
    db = RegistrationDB()
    db.add_producer(("channel", "a", "c"), Producer(peer(1)))
    db.add_producer(("channel", "a", "c"), Producer(peer(2)))
    assert db.remove_producer(("channel", "a", "c"), "127.0.0.1:1") == (True, 1)
    assert db.remove_producer(("channel", "a", "c"), "127.0.0.1:1") == (False, 1)
    assert db.remove_producer(("channel", "a", "c"), "127.0.0.1:2") == (True, 0)
    assert db.find_registrations("channel", "a", "c") == [("channel", "a", "c")]
    assert db.remove_producer(("channel", "x", "y"), "127.0.0.1:2") == (False, 0)


def test_find_registrations_wildcards():
    db = RegistrationDB()
    for key in [("topic", "a", ""), ("topic", "b", ""), ("channel", "a", "c1")]:
        db.add_registration(key)
    db.add_registration(("channel", "a", "c2"))
    db.add_registration(("channel", "b", "c1"))
    assert db.find_registrations("topic", "a", "") == [("topic", "a", "")]
    assert db.find_registrations("topic", "z", "") == []
    assert sorted(db.find_registrations("topic", "*", "")) == [
        ("topic", "a", ""),
        ("topic", "b", ""),
    ]
    assert sorted(db.find_registrations("topic", "*", "*")) == [
        ("topic", "a", ""),
        ("topic", "b", ""),
    ]
    assert sorted(db.find_registrations("channel", "a", "*")) == [
        ("channel", "a", "c1"),
        ("channel", "a", "c2"),
    ]
    assert sorted(db.find_registrations("channel", "*", "c1")) == [
        ("channel", "a", "c1"),
        ("channel", "b", "c1"),
    ]
    assert len(db.find_registrations("channel", "*", "*")) == 3
    # the category must match exactly
    assert db.find_registrations("*", "*", "*") == []
    assert db.find_registrations("nope", "*", "*") == []


def test_find_producers_with_wildcards_is_unique_per_peer():
    db = RegistrationDB()
    p1, p2 = peer(1), peer(2)
    db.add_producer(("channel", "a", "c1"), Producer(p1))
    db.add_producer(("channel", "a", "c2"), Producer(p1))
    db.add_producer(("channel", "a", "c2"), Producer(p2))
    producers = db.find_producers("channel", "a", "*")
    assert sorted(p.peer.id for p in producers) == ["127.0.0.1:1", "127.0.0.1:2"]
    assert len(db.find_producers("channel", "a", "c2")) == 2
    assert db.find_producers("channel", "zz", "*") == []
    assert db.find_producers("topic", "a", "") == []


def test_lookup_registrations_and_remove_registration_keep_indexes_in_step():
    db = RegistrationDB()
    p1 = peer(1)
    keys = [("client", "", ""), ("topic", "a", ""), ("channel", "a", "c")]
    for key in keys:
        db.add_producer(key, Producer(p1))
    assert sorted(db.lookup_registrations(p1.id)) == sorted(keys)
    db.remove_registration(("channel", "a", "c"))
    assert sorted(db.lookup_registrations(p1.id)) == sorted(keys[:2])
    assert db.find_registrations("channel", "a", "*") == []
    assert db.subkeys("channel", "a") == []
    db.remove_registration(("channel", "a", "c"))  # removing twice is harmless
    for key in keys[:2]:
        db.remove_producer(key, p1.id)
    assert db.lookup_registrations(p1.id) == []
    assert len(db) == 2  # keys stay


def test_keys_and_subkeys():
    db = RegistrationDB()
    db.add_registration(("topic", "a", ""))
    db.add_registration(("topic", "b", ""))
    db.add_registration(("channel", "a", "x"))
    assert db.keys("topic") == ["a", "b"]
    assert db.subkeys("channel", "a") == ["x"]
    assert db.keys("channel") == ["a"]
    assert db.keys("client") == []


def test_tombstone_expires_after_lifetime():
    record = Producer(peer(1))
    assert not record.is_tombstoned(10.0, now=0.0)
    record.tombstone(100.0)
    assert record.is_tombstoned(0.05, now=100.04)
    assert not record.is_tombstoned(0.05, now=100.06)
    assert record.tombstoned  # the flag stays; only its effect expires


def test_filter_active_by_inactivity_and_tombstone():
    fresh, stale, buried = Producer(peer(1, 100.0)), Producer(peer(2, 90.0)), Producer(peer(3))
    buried.tombstone(99.0)
    active = filter_active(
        [fresh, stale, buried], inactivity_timeout=5.0, tombstone_lifetime=2.0, now=100.0
    )
    assert active == [fresh]
    # /nodes passes a zero lifetime: tombstoned producers are listed
    active = filter_active([fresh, stale, buried], 5.0, 0.0, now=100.0)
    assert active == [fresh, buried]
    # exactly at the timeout is still active (Go: excluded only when strictly older)
    assert filter_active([stale], 10.0, 0.0, now=100.0) == [stale]


def test_matches():
    assert matches(("channel", "a", "c"), "channel", "*", "c")
    assert matches(("channel", "a", "c"), "channel", "a", "*")
    assert not matches(("channel", "a", "c"), "topic", "*", "*")
    assert not matches(("channel", "a", "c"), "channel", "b", "*")


def test_peer_info_shapes():
    p = peer(1)
    assert list(p.to_json()) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
    ]
    assert p.http_node == "10.0.0.1:4152"
