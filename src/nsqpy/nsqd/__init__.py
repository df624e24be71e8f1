"""nsqd: the daemon that receives, queues and delivers messages.

The map. Modules at this level mirror Go's nsqd (``nsqio/nsq``, directory ``nsqd/`` unless
said otherwise), named after the Go file they follow; what nsqpy adds lives in ``beyond/``.

Mirroring Go:

- ``nsqd.py`` -- nsqd.go: the daemon (topics, clients, listeners, start and exit)
- ``options.py`` -- options.go and apps/nsqd/options.go: every flag and config key;
  ``__main__.py`` -- apps/nsqd/main.go
- ``topic.py`` -- topic.go; ``channel.py`` -- channel.go (with in_flight_pqueue.go and
  internal/pqueue); ``consumer.py`` -- the ``Consumer`` interface atop channel.go
- ``message.py`` -- message.go (and ``MessageRun``: an MPUB's messages not yet built;
  ``RunMessage``: one of them in flight, reading its ID and body from the run);
  ``guid.py`` -- guid.go
- ``memory_queue.py`` -- the ``memoryMsgChan`` of topic.go and channel.go: a topic's and a
  channel's memory queue keep each batch as one run, shared by all channels; a channel builds
  its own messages from an MPUB's run only as it takes them
- ``collector.py`` -- what Go's runtime paces for it: CPython's full collections, held back
  after each by its cost so that a large backlog is not walked again and again; and the
  collections' pauses, which ``/stats`` reports as Go's reports its collector's
- ``client_v2.py`` -- client_v2.go's state (identity, negotiated settings, RDY and in-flight
  counts; a channel's ``Consumer``); ``connection.py`` -- its socket's I/O (protocol_v2.go's
  ``IOLoop`` and ``messagePump``, client_v2.go's reader and writer: input turns, output
  buffer, heartbeats, TLS and compression upgrades); ``protocol_v2.py`` -- protocol_v2.go
  (one method per verb); ``identify.py`` -- IDENTIFY from both
- ``http.py`` -- http.go (the route table); ``http_mpub.py`` -- http.go's ``doMPUB``;
  ``http_params.py`` -- how http.go reads a request's parameters
- ``lookup.py`` -- lookup.go and lookup_peer.go; ``stats.py`` -- stats.go and http.go's
  ``printStats``; ``statsd.py`` -- statsd.go
- ``tls.py`` -- nsqd.go's ``buildTLSConfig`` and the IDENTIFY upgrade; ``auth.py`` --
  internal/auth/authorizations.go
- ``backend.py`` -- backend_queue.go and dummy_backend_queue.go; ``diskqueue/`` -- Go's
  separate ``nsqio/go-diskqueue`` package
- ``metadata.py`` -- nsqd.go's ``nsqd.dat`` format; ``persistence.py`` -- nsqd.go's
  ``LoadMetadata``/``PersistMetadata`` (when ``nsqd.dat`` is read and written)
- ``backend_writes.py`` -- message.go's ``writeMessageToBackend`` and nsqd.go's health, with
  the batching of one publish's disk writes and the fsyncs a PUB's OK waits for
- ``errors.py`` -- the exceptions these modules share

Additions (``beyond/``, docs/beyond-go.md; each off by default or additive): ``http`` (the
routes Go lacks), ``metrics`` (Prometheus), ``dead_letter``, ``queue_limits`` (bounded
queues), ``inspect``, ``kick``, ``drain``, ``deferred_store`` (deferrals kept across a
restart), and the durable mode of ``--mem-queue-size=0``: ``topic_held`` and
``channel_held``.

Replication (``replica/``, docs/replication.md; on with --replica-peer): ``replica/group.py``
the runtime (``nsqd.replication``: this node's stream, links, takeover, the OK rule),
``replica/store.py`` a peer's store of another node's unfinished copies; the frames and
events are ``nsqpy.protocol.replica``.

PUB -> deliver -> FIN:

1. ``connection.py``: ``Connection.data_received`` parses the bytes into commands
   (``nsqpy.protocol.commands``); ``client_v2.py``: ``ClientV2.run_commands`` calls each
   verb's handler.
2. ``protocol_v2.py``: ``ProtocolV2.PUB`` checks the command, makes the message
   (``Topic.new_message``: ``message.py``, ``guid.py``) and puts it in the topic; the OK
   goes once the topic holds it (after any fsync under way, ``BackendWrites.running_syncs``).
   An MPUB's messages go in as one ``MessageRun`` (``Topic.put_batch``) when they may wait
   unbuilt.
3. ``topic.py``: ``Topic.put_message`` hands the message straight to each channel
   (``_fan_out``) when nothing waits before it, else queues it in memory or on disk
   (``backend_writes.py``, ``diskqueue/``) for the topic's pump (``_pump``) to copy later.
4. ``channel.py``: ``Channel.put_messages`` queues it; ``Channel.pump`` takes what fits a
   ready consumer's RDY window, puts it in flight (``start_in_flight_many``: attempts,
   deadline, owner; MPUBs' queued runs are built straight into flight as ``RunMessage`` objects,
   ``start_runs_in_flight``) and hands the frames to the consumer (``consumer.py``;
   ``ClientV2.send_messages`` buffers them in its connection, ``Connection.after_deliveries``
   flushes).
5. ``protocol_v2.py``: ``FIN`` (or ``FIN_RUN`` for a burst of FINs) calls
   ``Channel.finish_message`` (``finish_many``), which takes the message out of flight; in
   the durable mode its disk record is released then (``beyond/channel_held.py``).
"""

from .nsqd import NSQD, NSQDError
from .options import Options

__all__ = ["NSQD", "NSQDError", "Options"]
