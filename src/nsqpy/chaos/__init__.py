"""A Jepsen-style chaos harness for an NSQ cluster (``python -m nsqpy.chaos``, ``make chaos``).

- :mod:`.netns`: the private network (namespaces, veth links, a bridge; partitions, link
  degradation) and the clean-up of leftovers by name prefix;
- :mod:`.daemons`: 3 nsqd + 2 nsqlookupd (ours, or Go's binaries) inside it;
- :mod:`.workload`: producers and a consumer writing a history (JSON lines);
- :mod:`.faults`: the faults and their seeded schedule;
- :mod:`.checker`: lost / duplicated / unexpected / recovery times from the history;
- :mod:`.report`: text, JSON and a PNG plot;
- :mod:`.runner`: one run from start to clean-up.
"""
