"""The NSQ utilities as Go ships them (``apps/`` in nsqio/nsq): one module per command.

``nsq_tail``, ``to_nsq``, ``nsq_stat``, ``nsq_to_file``, ``nsq_to_http``, ``nsq_to_nsq`` and
``nsq_pubsub`` are installed as console scripts; each is a thin command line over
:mod:`nsqpy.client` sharing :mod:`nsqpy.apps.common` (flags, go-nsq options, errors, signals).
"""
