"""Runtime-free dispatch logic: everything a subscription's dispatcher decides.

Nothing here imports gevent, or Pykka and the actors other than for type names and
``BrokerError``; the dispatcher actor (:mod:`brokerlet.actors.dispatcher`) feeds these modules
its messages and carries out what they decide, so each rule is testable without an actor or a
socket (docs/architecture.md lists the modules and how to add a rule):

- ``strategy``: the interface between the read loop and a subscription type's rules;
  ``shared``, ``single_active`` (Exclusive, Failover) and ``key_shared`` implement it, and
  ``types`` says which serves which type;
- ``subscription``: membership, acks, redelivery, seek; ``delivery``: pending entries,
  redelivery counts, unacked limits; ``replay``: entries to deliver again;
- ``filters``: rules every read passes before selection (the seam for delayed delivery and
  batch-index acks);
- ``consumer`` and ``permits``: consumers and their permit accounting; ``ratelimit``: token
  buckets; ``read_backoff``: retry and read-failure backoff; ``cursor_saver``: when
  acknowledgements are stored; ``stats``: the subscription's stats snapshot;
  ``options``: switches that turn a rule off for tests and diagnostics.
"""
