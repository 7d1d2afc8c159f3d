"""Producer semantics a topic applies: access modes with the topic epoch, and deduplication.

Both are plain state machines run by the topic actor (no gevent, no Pykka): `access` decides
who may produce, `dedup` decides which SENDs are repeats. `appends` is the connection's side:
a slice of SENDs made into append items (compiled, with the codec).
"""
