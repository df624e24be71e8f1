"""The data pipeline on Spark, mirroring NSQ's channels: each job reads its own channel.

* ``archive``: a topic into Parquet partitioned by date and hour, deduplicated on
  ``(nsqd, id)`` within a watermark: effectively once.
* ``aggregate``: windowed counts per key of JSON events, published back to an NSQ topic.

``nsqpy-pipeline --help`` runs them; :mod:`nsqpy.demo` (``make run``) shows them on a local
NSQ cluster.
"""

from .jobs import SourceConfig, aggregate_query, archive_query

__all__ = ["SourceConfig", "aggregate_query", "archive_query"]
