"""Replication between nsqd peers (docs/replication.md): what a node keeps for its peers.

- ``store``: the peer's store of one owner incarnation's unfinished copies: an append-only
  log replayed into an index on open, compacted when mostly finished, listed for a takeover.
"""
