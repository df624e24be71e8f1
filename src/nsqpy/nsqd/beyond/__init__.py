"""nsqd's additions to Go's nsqd (docs/beyond-go.md): each is off by default or additive.

- ``http``: the routes Go lacks, appended to the route table by ``nsqd/http.py``
- ``metrics``: Prometheus ``/metrics``
- ``dead_letter``: server-side max attempts and dead-letter topics
- ``queue_limits``: ``--max-queue-bytes`` and ``--queue-full-policy``
- ``inspect``: reading what a topic or channel holds without consuming it
- ``kick``: ``POST /client/kick``
- ``drain``: ``--drain-timeout``, a graceful drain before shutdown
- ``deferred_store``: deferred messages that keep their deferral across a clean restart
- ``topic_held`` and ``channel_held``: the durable mode (``--mem-queue-size=0``, with
  ``--sync-every=1`` for in-flight messages), where a message's disk record is kept until it
  is delivered to every channel and finished
"""
