"""A dialled link's diagnosis from its socket monitor's events (zmq_transport.Link): an early close of the
CURVE handshake, or a peer turning a connection away for now, is retried and counted; only the peer's
ZAP refusal of our key, or a run of early closes with no success, calls the link refused."""
from __future__ import annotations

import pytest
import zmq

from fedhet.parties.zmq_transport import EARLY_CLOSES_CONCLUSIVE, HANDSHAKING, REFUSED, UP, Link

pytestmark = pytest.mark.unit


def _connect_and_close(link: Link, ev: int, value: int = 0) -> None:
    link.event(zmq.EVENT_CONNECTED, 0)
    link.event(ev, value)


def test_early_closes_are_retried_until_a_run_of_them_says_the_key_is_wrong():
    link = Link("server", "tcp://127.0.0.1:1")
    for i in range(EARLY_CLOSES_CONCLUSIVE - 1):
        _connect_and_close(link, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        assert link.state == HANDSHAKING and link.retries == i + 1, (i, link.state)
    _connect_and_close(link, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    assert link.state == REFUSED and "does not match its secret key" in link.detail
    assert f"{EARLY_CLOSES_CONCLUSIVE} times in a row" in link.detail


def test_a_success_between_early_closes_starts_the_count_again():
    link = Link("server", "tcp://127.0.0.1:1")
    for _ in range(3):
        for _ in range(EARLY_CLOSES_CONCLUSIVE - 1):
            _connect_and_close(link, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        assert link.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0) and link.state == UP
        link.event(zmq.EVENT_DISCONNECTED, 0)
    assert link.state != REFUSED and link.retries == 3 * (EARLY_CLOSES_CONCLUSIVE - 1)


def test_turned_away_is_retried_and_a_zap_refusal_is_conclusive_at_once():
    link = Link("server", "tcp://127.0.0.1:1")
    for _ in range(3 * EARLY_CLOSES_CONCLUSIVE):   # too many connections under our key, for now
        _connect_and_close(link, zmq.EVENT_HANDSHAKE_FAILED_AUTH, 500)
    assert link.state == HANDSHAKING and link.retries == 3 * EARLY_CLOSES_CONCLUSIVE
    _connect_and_close(link, zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
    assert link.state == REFUSED and "refused our key (ZAP status 400)" in link.detail
