"""Streaming intake: requests arrive on a queue, an aggregator groups them, the batch pipeline answers them.

Producers put one request at a time on a queue (:mod:`.producer`, or the HTTP endpoint in
:mod:`.http`); the aggregator (:mod:`.aggregator`) drains it into groups of up to ``max_items``
or whatever came within ``max_wait`` of a group's first item; each group goes through the
existing pipeline and its messages are acknowledged only once the group's output is durably
written. Queue backends (:mod:`.queues`) share one small interface. See ``docs/streaming.md``.
"""
