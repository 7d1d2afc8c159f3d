"""Runtime-free dispatch logic: everything a subscription's dispatcher decides.

Nothing here imports gevent or Pykka at run time; the dispatcher actor
(:mod:`brokerlet.actors.dispatcher`) feeds these modules its messages and carries out what they
decide, so each rule is testable without an actor or a socket.
"""
