"""Producer semantics a topic applies: access modes with the topic epoch, and deduplication.

Both are plain state machines run by the topic actor (no gevent, no Pykka): `access` decides
who may produce, `dedup` decides which SENDs are repeats.
"""
