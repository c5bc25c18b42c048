"""The job's synthetic inputs: client c's vector x_c uniform in [-1, 1]^m and weight w_c in 1..100."""
from __future__ import annotations

import numpy as np

from fedhet.algorithms.secagg_job.messages import SERVER
from fedhet.algorithms.secagg_job.settings import CLIP, MAX_WEIGHT, Settings
from fedhet.parties.contract import PartyContext


def client_names(k: int) -> list[str]:
    return [f"c{i:02d}" for i in range(k)]


def make_inputs(k: int, m: int, seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    xs = {c: rng.uniform(-1, 1, m) for c in client_names(k)}
    ws = {c: float(rng.integers(1, int(MAX_WEIGHT) + 1)) for c in client_names(k)}
    return xs, ws


def exact_mean(xs: dict, ws: dict) -> np.ndarray:
    """The weighted mean of the clipped vectors: the server's test oracle, not part of the protocol."""
    return sum(ws[c] * np.clip(xs[c], -CLIP, CLIP) for c in xs) / sum(ws.values())


def load_data(s: Settings, ctx: PartyContext) -> dict:
    """A client's vector and weight (clients are named c00, c01, ...); the server's: the exact mean."""
    xs, ws = make_inputs(s.n_clients, s.m, s.input_seed)
    if ctx.role == SERVER:
        return {"exact": exact_mean(xs, ws)}
    if ctx.name not in xs:
        raise ValueError(f"secagg_bench: clients must be named {client_names(s.n_clients)}, got {ctx.name!r}")
    return {"x": xs[ctx.name], "w": ws[ctx.name]}
