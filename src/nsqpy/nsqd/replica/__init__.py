"""Replication between nsqd peers (docs/replication.md).

- ``group``: the runtime, ``nsqd.replication`` with --replica-peer: this node's stream and its
  links to the peers, the peers' stores, takeover, the OK rule.
- ``store``: the peer's store of one owner incarnation's unfinished copies: an append-only
  log replayed into an index on open, compacted when mostly finished, listed for a takeover.
"""
