"""Topic compaction: the compacted view of a topic and the compactor that builds it.

`view` holds a compacted view (the latest message of each key, with its original message
id, up to a horizon) and its crash-safe file; `compactor` is Pulsar's two-phase
compaction over a ledger; `runner` runs it off the actors' greenlets.
"""
