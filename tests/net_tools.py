"""Loopback networking helpers of the transport tests (a helper module of tests/)."""
from __future__ import annotations

import time

import zmq

from fedhet.parties.ops.engines.local import free_port  # the one definition; tests import it from here


def loopback_endpoints(names) -> dict[str, str]:
    """A distinct free loopback endpoint per name (drawn at random: two separate draws can meet)."""
    taken: set[int] = set()
    out = {}
    for n in names:
        port = free_port(taken)
        taken.add(port)
        out[n] = f"tcp://127.0.0.1:{port}"
    return out


def wait_for(pred, timeout=60.0, what="condition", poll=0.005):
    """Poll ``pred`` until it is true; fail the test naming ``what`` after ``timeout`` seconds (a
    deadline that only matters when the code is broken: a loaded machine only makes the wait longer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def curve_dealer(keys: dict, endpoint: str, *, server: str = "server", client: str = "client1"):
    """A raw CURVE DEALER socket holding ``client``'s keys, connected to ``server`` at ``endpoint``
    (``keys``: name -> (public, secret)); returns (context, socket); ``context.destroy(linger=0)``
    closes both."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.curve_serverkey = keys[server][0]
    s.curve_publickey, s.curve_secretkey = keys[client]
    s.connect(endpoint)
    return ctx, s
