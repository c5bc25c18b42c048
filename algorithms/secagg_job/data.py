"""The job's synthetic inputs: client c's vector x_c uniform in [-1, 1]^m and weight w_c in 1..100; which
clients drop out, and after which step (:func:`dropout_plan`)."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from fedhet.algorithms.secagg_job.messages import SERVER
from fedhet.algorithms.secagg_job.settings import CLIP, MAX_WEIGHT, Settings
from fedhet.parties.contract import PartyContext
from fedhet.protocols.secagg import STEPS

# A client can vanish before its first message ("start") or after any of its messages but the last: after
# "unmask" it has sent everything and the round is over for it.
DROP_STEPS = ("start",) + STEPS[:-1]
_PLAN_STREAM = 1  # the plan's random stream, apart from the inputs' (make_inputs)


def client_names(k: int) -> list[str]:
    return [f"c{i:02d}" for i in range(k)]


def make_inputs(k: int, m: int, seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    xs = {c: rng.uniform(-1, 1, m) for c in client_names(k)}
    ws = {c: float(rng.integers(1, int(MAX_WEIGHT) + 1)) for c in client_names(k)}
    return xs, ws


def dropout_plan(s: Settings) -> dict[str, str]:
    """Client -> the step after which it vanishes in every timed round (``"start"``: before its first message).

    ``s.dropouts`` clients drawn from ``s.input_seed`` (numpy's default_rng, a stream apart from the
    inputs'); the i-th one drawn vanishes after ``DROP_STEPS[i % 4]``, so the steps are spread evenly
    (every one of them from 4 dropouts on).  Any party computes it alone, with no message: each client
    to know whether and when it vanishes; the server reports whom it counted, which tests compare with
    the plan.  A client that vanishes after ``"masked"`` has sent its masked input: it still counts in the sum.
    """
    rng = np.random.default_rng((_PLAN_STREAM, s.input_seed))
    names = client_names(s.n_clients)
    chosen = rng.choice(len(names), size=s.dropouts, replace=False)
    return {names[int(i)]: DROP_STEPS[j % len(DROP_STEPS)] for j, i in enumerate(chosen)}


def exact_sum(xs: dict, ws: dict, who: Iterable[str] | None = None) -> tuple[np.ndarray, float]:
    """The weighted sum of the clipped vectors of the clients ``who`` (default all) and their weights' sum:
    the server's test oracle, not part of the protocol."""
    keep = set(xs if who is None else who)
    order = [c for c in xs if c in keep]  # the clients' order, whatever the order of ``who``
    return sum(ws[c] * np.clip(xs[c], -CLIP, CLIP) for c in order), float(sum(ws[c] for c in order))


def exact_mean(xs: dict, ws: dict, who: Iterable[str] | None = None) -> np.ndarray:
    """The weighted mean of the clipped vectors (of the clients ``who``, default all): the server's test oracle."""
    total, weight = exact_sum(xs, ws, who)
    return total / weight


def load_data(s: Settings, ctx: PartyContext) -> dict:
    """A client's vector and weight (clients are named c00, c01, ...); the server's: every client's (its test
    oracle, for the exact sum over the clients it counted)."""
    xs, ws = make_inputs(s.n_clients, s.m, s.input_seed)
    if ctx.role == SERVER:
        return {"xs": xs, "ws": ws}
    if ctx.name not in xs:
        raise ValueError(f"secagg_bench: clients must be named {client_names(s.n_clients)}, got {ctx.name!r}")
    return {"x": xs[ctx.name], "w": ws[ctx.name]}
