#!/usr/bin/env python
"""Flower 1.42 SecAgg+ baseline: one round in Flower's own simulation engine.

Standalone: imports only the standard library, numpy and flwr (fedhet is not
importable in the interpreter that has Flower).  Run it with

    PY benchmarks/flower_secagg.py --clients 10 --m 1000 --num-shares 9 --threshold 5   # PY: a Python with flwr[simulation]

Progress goes to stderr; the last stdout line is one JSON object.  The exit
status is 0 when the check passed (``ok``), 1 otherwise.

What runs
---------
* ServerApp: the documented Flower 1.x way (flwr's ``flower-secure-aggregation``
  example): ``LegacyContext`` + ``FedAvg`` + ``DefaultWorkflow(fit_workflow=
  SecAggPlusWorkflow(num_shares=S, reconstruction_threshold=T,
  clipping_range=C, max_weight=W, timeout=...))``, ``num_rounds=1``.
  Quantisation range (2**22) and modulus range (2**32) are Flower's defaults.
  FedAvg samples all K clients (``fraction_fit=1``, ``min_*_clients=K``) and
  federated evaluation is off (``fraction_evaluate=0``).
* ClientApp: a ``NumPyClient`` whose ``fit`` returns ``[x_i]`` with
  ``num_examples = w_i``; mods ``[dropout_mod, secaggplus_mod]``.  Client i is
  the SuperNode with ``partition-id`` i; ``rng = default_rng(seed + i)``,
  ``x_i = rng.uniform(-1, 1, M)``, ``w_i = rng.integers(1, W + 1)``.
  SecAgg+ sums ``[w_i/W * x_i]`` (masked) together with the quantised weights,
  so the workflow itself returns the w-weighted mean; FedAvg's own
  ``aggregate_fit`` then averages identical copies of that vector (no-op).
* Simulation: ``flwr.simulation.run_simulation(server_app, client_app,
  num_supernodes=K, backend_name="ray", backend_config=...)``.  The ServerApp
  runs in a thread of this process, so the strategy hands the aggregate to
  the parent through a module-level dict (no temp file needed).

Check
-----
``ref = sum_i w_i clip(x_i, -C, C) / sum_i w_i`` over the clients whose masked
vector entered the sum (i.e. that completed the collect-masked-vectors stage;
clients that drop in the unmask stage are *included*, their private masks are
reconstructed from shares).  Flower's error has two sources:

1. stochastic rounding of each client's ``(clip(v)+C) * Q/(2C)`` to an integer,
   error < 1 quantum = 2C/Q per client and coordinate, so < n*2C/Q in the sum,
   which the workflow divides by ``sum_i q_i / Q``;
2. weights are quantised, ``q_i = round(w_i/W * Q)``, and the result is the
   q-weighted mean: ``|mean_q - mean_w| = |sum e_i (x_i - mean_w)| / sum q_i
   <= n * 0.5 * 2B / sum q_i`` with ``|e_i| <= 1/2`` and ``B = max|clip(x)|``.

So ``err_bound = n (2C + B) / sum_i q_i  (+1e-9 float slack)``; with
K=10, W=100 that is ~4e-6.  Note that Flower clips ``w_i/W * x_i``, not
``x_i``; with ``|x| < 1 <= C`` (the default C=4) nothing is clipped and the
two agree, for C < 1 they differ and ``ok`` will honestly be false.

Timing
------
* ``wall_s``: the whole ``run_simulation`` call (Ray start-up, actor creation,
  node registration, warm-up, round, Ray shutdown).
* ``round_s``: measured inside the ServerApp: from entering the SecAgg+ fit
  workflow (before ``configure_fit``) to the dequantised aggregate in hand in
  ``strategy.aggregate_fit``.
* ``stages_s``: wall time of each SecAgg+ stage (``setup``, ``share_keys``,
  ``collect_masked_vectors``, ``unmask``; the last includes server-side
  unmasking + dequantisation), measured by a thin ``SecAggPlusWorkflow``
  subclass that only wraps the four stage methods.  Flower itself only logs
  the stages at DEBUG level without times.
* ``warmup_s``: before the round, unless ``--no-warmup``, the ServerApp sends
  one legacy ``get_properties`` message to every node and waits for the
  replies.  This makes Ray start every actor process (each one imports flwr,
  ~seconds on 2 cores) *before* the round, so ``round_s`` measures the
  protocol plus Flower's engine overhead, not actor cold start.  Note the
  in-memory grid and the simulation engine both poll every 0.1 s, so every
  stage has a ~0.1-0.3 s latency floor in Flower's simulation regardless of
  the work done.

Resources (``--cpus-per-client``)
---------------------------------
Flower's Ray backend creates ``floor(num_cpus / cpus_per_client)`` actors (one
Python process each) and as many worker threads; the K virtual clients are
multiplexed over that pool, and their state (keys, shares) lives in the
Context that Flower ships with every message, so any number of actors works.
The default is 1.0, i.e. two actors on this 2-core machine: the per-message
work is a few ms of crypto, so more actors only add process start-up and
memory (each actor imports flwr) and oversubscribe the two cores.  Measured
here (K=10, M=1000, S=9, T=5, one run each): cpus-per-client 1.0 (2 actors)
wall 7.4 s / round 0.75 s; 0.5 (4 actors) 11.6 s / 0.96 s; 0.2 (10 actors,
all clients concurrent) 17.5 s / 0.95 s; 2.0 (1 actor) 9.6 s / 1.05 s.  The
round time is dominated by Flower's 0.1 s polling, the wall time by actor
start-up.  Pass e.g. 0.1 to get ``num_cpus/0.1`` concurrent actors.  Ray is
started with ``address="local"`` (never attaches to another engineer's Ray
cluster), ``num_cpus = os.cpu_count()``, no dashboard, logging at ERROR and
``log_to_driver=False``.

Dropouts (``--dropouts D``)
---------------------------
D clients (chosen with ``default_rng(seed)``) drop out: a client mod placed in
front of ``secaggplus_mod`` raises an exception when the message for its drop
stage arrives.  Flower's simulation engine turns that into an error reply,
which the SecAgg+ workflow treats exactly like a missing reply (node removed
from the active set) - immediate and deterministic, unlike the example's
"sleep past the timeout" trick, which would cost ``timeout`` seconds per stage
and tie up an actor.  By default the D clients are spread round-robin over the
stages ``collect_masked_vectors`` and ``unmask`` (``--dropout-stages 2,3``).
Stages 0 (``setup``) and 1 (``share_keys``) can be selected too, but then
Flower 1.42 loses the whole round (checked with K=10, S=9, T=5, D=1): a node
that drops before its key shares were distributed is still counted as
"sampled", so in the unmask stage the server lists it as *dead* to its
neighbours; their ``secaggplus_mod`` has no sk1 share for it and raises
``KeyError`` (so they fail too), and the server then logs "Not enough shares
to recover secret in unmask vectors stage" and halts: no aggregate, ``ok`` is
false, exit status 1.  The workflow also halts whenever some node keeps
fewer than T active neighbours (itself included).

Flower constraints enforced here: ``2 < S <= K``, ``T < S``, and S odd unless
``S == K`` (by code reading: Flower 1.42 bumps an even S by one *after*
sending S to the clients, which then get S+1 neighbours for S shares and
crash).  SecAgg+ sums in Z_{2^32} with 2^22 quantisation
levels, so K must stay below 2^32/2^22 = 1024.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")
QUANTIZATION_RANGE = 4194304  # Flower's default (2**22), not overridden
DROP_MARKER = "SIMULATED_DROPOUT"

# Filled by the ServerApp (it runs in a thread of this process).
RESULT: dict[str, Any] = {"stages_s": {}}


def progress(msg: str) -> None:
    print(f"[flower_secagg {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def client_data(seed: int, i: int, m: int, max_weight: float) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed + i)
    x = rng.uniform(-1.0, 1.0, m)
    w = int(rng.integers(1, int(max_weight) + 1))
    return x, w


class _DropFilter(logging.Filter):
    """Hide Flower's ERROR lines for the dropouts we inject on purpose."""

    # Logged by Flower's RayBackend (without the exception text) right before
    # the traceback that carries DROP_MARKER; hidden only when D > 0.
    hide_backend_line = False
    collapse = True
    seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # pragma: no cover
            return True
        if _DropFilter.hide_backend_line and text.startswith(
                "An exception was raised when processing a message by RayBackend"):
            return False
        if DROP_MARKER in text:
            return False
        if _DropFilter.collapse and "\n" in text:
            # Keep Flower's genuine errors, but only their last line (the
            # exception message) instead of Ray's nested tracebacks.
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            errs = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception): ", ln)
                    and "ClientAppException" not in ln and "RayTaskError" not in ln]
            short = (errs or lines)[-1]
            if short in self.seen:  # same failure logged again / by other nodes
                return False
            self.seen.add(short)
            record.msg, record.args = f"(traceback hidden, shown once) {short}", None
            record.exc_info = record.exc_text = None
        return True


_FILTER = _DropFilter()


def quiet_flower(verbose: bool) -> None:
    _DropFilter.collapse = not verbose
    lg = logging.getLogger("flwr")
    lg.addFilter(_FILTER)
    for h in lg.handlers:
        h.addFilter(_FILTER)
        h.setLevel(logging.DEBUG if verbose else logging.ERROR)
    if not verbose:
        lg.setLevel(logging.ERROR)
    for name in ("ray", "ray.data", "ray.tune", "ray.serve"):
        logging.getLogger(name).setLevel(logging.ERROR)


def make_client_app(k: int, m: int, seed: int, max_weight: float, drop_plan: dict[int, str]):
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod

    def client_fn(context):
        pid = int(context.node_config["partition-id"])
        x, w = client_data(seed, pid, m, max_weight)

        class VecClient(NumPyClient):
            def get_properties(self, config):
                return {"pid": pid}

            def fit(self, parameters, config):
                return [x], w, {"pid": pid}

        return VecClient().to_client()

    def dropout_mod(msg, ctxt, call_next):
        # Runs in front of secaggplus_mod; raises (-> error reply, which the
        # SecAgg+ workflow handles as a dropped node) at the planned stage.
        if drop_plan and msg.metadata.message_type == "train":
            pid = int(ctxt.node_config["partition-id"])
            stage = drop_plan.get(pid)
            if stage is not None:
                cfg = msg.content.config_records.get("secaggplus_configs")
                if cfg is not None and cfg.get("stage") == stage:
                    raise RuntimeError(f"{DROP_MARKER}: client {pid} drops at stage {stage}")
        return call_next(msg, ctxt)

    return ClientApp(client_fn=client_fn, mods=[dropout_mod, secaggplus_mod])


def make_server_app(args):
    from flwr.common import GetPropertiesIns, Message, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.constant import MessageTypeLegacy
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    k = args.clients

    class RecordingFedAvg(FedAvg):
        def aggregate_fit(self, server_round, results, failures):
            t_in = time.perf_counter()
            params, metrics = super().aggregate_fit(server_round, results, failures)
            RESULT["t_agg"] = time.perf_counter()
            RESULT["t_agg_in"] = t_in
            RESULT["included_pids"] = sorted(int(fr.metrics["pid"]) for _, fr in results)
            RESULT["num_failures"] = len(failures)
            if params is not None:
                RESULT["aggregate"] = parameters_to_ndarrays(params)[0].copy()
            return params, metrics

    class TimedSecAggPlusWorkflow(SecAggPlusWorkflow):
        """SecAggPlusWorkflow, unchanged except that each stage is timed."""

        def __call__(self, grid, context):
            RESULT["t_fit_start"] = time.perf_counter()
            progress("SecAgg+ round started")
            super().__call__(grid, context)
            RESULT["t_fit_end"] = time.perf_counter()

        def _timed(self, name, fn, grid, context, state):
            t0 = time.perf_counter()
            ok = fn(grid, context, state)
            RESULT["stages_s"][name] = round(time.perf_counter() - t0, 4)
            RESULT.setdefault("active_after", {})[name] = len(state.active_node_ids)
            progress(f"stage {name}: {RESULT['stages_s'][name]:.3f}s, "
                     f"{len(state.active_node_ids)} active, continue={ok}")
            if not ok:
                RESULT["halted_at"] = name
            return ok

        def setup_stage(self, grid, context, state):
            return self._timed("setup", super().setup_stage, grid, context, state)

        def share_keys_stage(self, grid, context, state):
            return self._timed("share_keys", super().share_keys_stage, grid, context, state)

        def collect_masked_vectors_stage(self, grid, context, state):
            return self._timed("collect_masked_vectors",
                               super().collect_masked_vectors_stage, grid, context, state)

        def unmask_stage(self, grid, context, state):
            return self._timed("unmask", super().unmask_stage, grid, context, state)

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        RESULT["t_server_start"] = time.perf_counter()
        quiet_flower(args.verbose)  # Flower may have re-armed its handlers
        if args.warmup:
            t0 = time.perf_counter()
            node_ids = list(grid.get_node_ids())
            while len(node_ids) < k:
                time.sleep(0.05)
                node_ids = list(grid.get_node_ids())
            content = compat.getpropertiesins_to_recorddict(GetPropertiesIns({}))
            msgs = [Message(content=content, dst_node_id=nid,
                            message_type=MessageTypeLegacy.GET_PROPERTIES, group_id="warmup")
                    for nid in node_ids]
            replies = list(grid.send_and_receive(msgs, timeout=args.timeout))
            RESULT["warmup_s"] = round(time.perf_counter() - t0, 4)
            RESULT["warmup_replies"] = sum(not r.has_error() for r in replies)
            progress(f"warm-up: {RESULT['warmup_replies']}/{k} replies "
                     f"in {RESULT['warmup_s']:.2f}s")

        strategy = RecordingFedAvg(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=k,
            min_evaluate_clients=k,
            min_available_clients=k,
            initial_parameters=ndarrays_to_parameters([np.zeros(args.m)]),
        )
        lctx = LegacyContext(context=context, config=ServerConfig(num_rounds=1),
                             strategy=strategy)
        fit_workflow = TimedSecAggPlusWorkflow(
            num_shares=args.num_shares,
            reconstruction_threshold=args.threshold,
            max_weight=args.max_weight,
            clipping_range=args.clip,
            timeout=args.timeout,
        )
        DefaultWorkflow(fit_workflow=fit_workflow)(grid, lctx)
        RESULT["t_server_end"] = time.perf_counter()

    return app


def plan_dropouts(k: int, d: int, stages: list[int], seed: int) -> dict[int, str]:
    if d == 0:
        return {}
    rng = np.random.default_rng([seed, 0xD809])
    pids = sorted(int(p) for p in rng.choice(k, size=d, replace=False))
    return {pid: STAGES[stages[j % len(stages)]] for j, pid in enumerate(pids)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--m", type=int, required=True)
    ap.add_argument("--num-shares", type=int, required=True)
    ap.add_argument("--threshold", type=int, required=True)
    ap.add_argument("--clip", type=float, default=4.0)
    ap.add_argument("--max-weight", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropouts", type=int, default=0)
    ap.add_argument("--dropout-stages", default="2,3",
                    help="comma list of stage indices 0..3 (0=setup, 1=share_keys, "
                         "2=collect_masked_vectors, 3=unmask) to spread dropouts over; "
                         "0 and 1 make Flower 1.42 halt the round")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--cpus-per-client", type=float, default=1.0)
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--verbose", action="store_true", help="show Flower's DEBUG log")
    args = ap.parse_args()

    k, s, t = args.clients, args.num_shares, args.threshold
    if k < 2:
        ap.error("--clients must be >= 2")
    if not 2 < s <= k:
        ap.error("Flower needs 2 < num_shares <= clients")
    if not 1 < t < s:
        ap.error("Flower needs 1 < threshold < num_shares")
    if s != k and s % 2 == 0:
        ap.error("num_shares must be odd (or equal to --clients) in Flower 1.42")
    if args.max_weight < 1:
        ap.error("--max-weight must be >= 1")
    stages = [int(v) for v in args.dropout_stages.split(",") if v.strip()]
    if not stages or any(v not in (0, 1, 2, 3) for v in stages):
        ap.error("--dropout-stages must list indices in 0..3")
    if not 0 <= args.dropouts <= k - 2:
        ap.error("--dropouts must be in 0..clients-2")

    import flwr
    import ray
    from flwr.simulation import run_simulation

    quiet_flower(args.verbose)

    drop_plan = plan_dropouts(k, args.dropouts, stages, args.seed)
    if drop_plan:
        _DropFilter.hide_backend_line = not args.verbose
        progress(f"dropout plan (partition-id -> stage): {drop_plan}")

    client_app = make_client_app(k, args.m, args.seed, args.max_weight, drop_plan)
    server_app = make_server_app(args)
    backend_config = {
        "client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0},
        "init_args": {
            "address": "local",
            "num_cpus": os.cpu_count() or 2,
            "num_gpus": 0,
            "include_dashboard": False,
            "logging_level": logging.ERROR,
            "log_to_driver": bool(args.verbose),
            "configure_logging": True,
        },
    }
    n_actors = int((os.cpu_count() or 2) / args.cpus_per_client)
    progress(f"flwr {flwr.__version__}, ray {ray.__version__}: K={k} M={args.m} S={s} "
             f"T={t} C={args.clip} W={args.max_weight} D={args.dropouts}, "
             f"{n_actors} Ray actors")

    error = None
    t0 = time.perf_counter()
    try:
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=k,
                       backend_name="ray", backend_config=backend_config,
                       verbose_logging=args.verbose)
    except BaseException as ex:  # noqa: BLE001 - report, don't crash without JSON
        error = f"{type(ex).__name__}: {ex}"
        progress(f"run_simulation raised {error}")
    wall_s = time.perf_counter() - t0
    progress(f"run_simulation returned after {wall_s:.2f}s")

    # ---- check -------------------------------------------------------------
    agg = RESULT.get("aggregate")
    included = RESULT.get("included_pids")
    max_err = err_bound = None
    ok = False
    if agg is not None and included:
        xs, ws = zip(*(client_data(args.seed, i, args.m, args.max_weight) for i in included))
        xc = np.clip(np.stack(xs), -args.clip, args.clip)
        w = np.asarray(ws, dtype=np.float64)
        ref = (w[:, None] * xc).sum(0) / w.sum()
        q = np.asarray([round(wi / args.max_weight * QUANTIZATION_RANGE) for wi in ws],
                       dtype=np.float64)
        n = len(included)
        bmax = float(np.abs(xc).max())
        err_bound = n * (2.0 * args.clip + bmax) / q.sum() + 1e-9
        max_err = float(np.abs(np.asarray(agg, dtype=np.float64) - ref).max())
        ok = bool(agg.shape == ref.shape and max_err <= err_bound)
        expected = sorted(i for i in range(k)
                          if drop_plan.get(i) not in ("setup", "share_keys",
                                                      "collect_masked_vectors"))
        if included != expected:
            ok = False
            error = (error or "") + f" included clients {included} != expected {expected}"
    elif error is None:
        error = "no aggregate: secure aggregation halted at stage " + str(
            RESULT.get("halted_at", "?"))

    round_s = None
    if "t_agg" in RESULT and "t_fit_start" in RESULT:
        round_s = RESULT["t_agg"] - RESULT["t_fit_start"]

    out = {
        "impl": "flower-secaggplus-sim-ray",
        "clients": k,
        "m": args.m,
        "num_shares": s,
        "threshold": t,
        "clip": args.clip,
        "max_weight": args.max_weight,
        "seed": args.seed,
        "dropouts": args.dropouts,
        "dropout_plan": {str(p): st for p, st in drop_plan.items()},
        "included_clients": len(included) if included else 0,
        "wall_s": round(wall_s, 4),
        "round_s": None if round_s is None else round(round_s, 4),
        "stages_s": RESULT["stages_s"],
        "warmup_s": RESULT.get("warmup_s"),
        "startup_s": (round(RESULT["t_fit_start"] - t0, 4)
                      if "t_fit_start" in RESULT else None),
        "active_after_stage": RESULT.get("active_after", {}),
        "max_err": max_err,
        "err_bound": err_bound,
        "ok": ok,
        "cpus_per_client": args.cpus_per_client,
        "ray_actors": n_actors,
        "timeout": args.timeout,
        "flwr_version": flwr.__version__,
        "ray_version": ray.__version__,
    }
    if error:
        out["error"] = error.strip()
    progress(f"ok={ok} max_err={max_err} bound={err_bound} round_s={out['round_s']}")
    sys.stdout.flush()
    print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
