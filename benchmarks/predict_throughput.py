"""Prediction throughput: vertical ``fedhet predict`` as processes beside plaintext inference of the same model.

For STFL (guests send the host their codes in the clear) and the HE split network (the encrypted layer's
forward half per batch, Paillier): the algorithm's smoke federation is trained in memory, its parts
written as a run writes them and exported; every party gets N new rows (rows near its part's own check
rows; the guests lack a few IDs and hold a few extra).  Then, in one script run:

* **federated**: ``fedhet predict``'s job through the real launcher (every party its own process, CURVE
  ZeroMQ, PSI, the declared messages), audited; rows/s = rows predicted / wall time of the job (process
  start to last result), and the label party's role alone (PSI + exchange + scoring + CSV);
* **plaintext**: the same rows, aligned in one process, scored with the EXPORTED modules
  (``load_export`` + ``score``; the HE layer's output computed in the clear from both shares), best of 3;

and checks the two give the same predictions.  Results: ``benchmarks/results/predict_throughput.{json,md}``.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from fedhet.algorithms import registry
from fedhet.algorithms.scoring import score
from fedhet.parties.ops.export import export_run, load_export
from fedhet.algorithms.party_table import TableSpec, load_party_table
from fedhet.algorithms.predict import PREDICTIONS, columns, own_rows, read_predictions
from fedhet.parties.ops.predict import job_federation
from fedhet.algorithms.toolkit import sorted_intersection
from fedhet.parties.contract import installed_entry_points
from fedhet.parties.federation import Federation, load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.model_store import write_part

ALGORITHMS = ("stfl", "he_split")


# ------------------------------------------------------------------------------------ shared with the tests
def smoke(name: str) -> Federation:
    """Installed algorithm ``name``'s smoke federation (``smoke.toml`` beside its package's ``__init__.py``)."""
    return load(Path(str(resources.files(installed_entry_points()[name].module) / "smoke.toml")))


def train(fed: Federation, run_dir: Path) -> dict:
    """Train ``fed`` in memory; its parts written as a run writes them (RUN/parties/<name>/model/)."""
    models: dict = {}
    run_inmemory(registry.get_algorithm(fed.algorithm_name), [(p.name, p.role) for p in fed.parties],
                 fed.algorithm_cfg(), seed=fed.seed, models=models, timeout=600)
    for party, part in models.items():
        write_part(run_dir / "parties" / party / "model", part, part.header)
    return models


def write_rows(meta: dict, ids: list[str], path: Path, rng: np.random.Generator) -> dict:
    """A new-rows CSV for a part: column ``id`` and the part's feature columns, each row one of its check
    rows scaled by 1 + 5 % noise (values in the range it was trained on); returns the data spec."""
    names = meta.get("feature_names")
    check = meta["check"]["inputs"]
    base = np.concatenate([np.asarray(check[k], dtype=np.float64).reshape(len(check[k]), -1)
                           for k in (names if isinstance(names, dict) else ["x"])], axis=1)
    X = base[rng.integers(len(base), size=len(ids))] * (1 + 0.05 * rng.normal(size=(len(ids), base.shape[1])))
    lines = [",".join(["id", *columns(meta)])] + [",".join([i, *map(repr, map(float, x))]) for i, x in zip(ids, X)]
    path.write_text("\n".join(lines) + "\n")
    return {"path": path.name, "id": "id"}


def plaintext_vertical(name: str, s: Any, tables: dict, loaded: dict, exported: dict, label: str) -> tuple[list, Any]:
    """The label party's predictions computed in one process: every party's new rows (``tables``) aligned as
    PSI's "sorted" order does, scored with the exported modules (``loaded``: party -> ``load_export``'s
    module and metadata; ``exported``: party -> export folder); the HE split layer's output from both
    shares in the clear; F³'s coordinator part on every owner's h in the clear.  Returns the common IDs and
    the probabilities."""
    peers = [p for p in tables if p != label]
    order, rows = sorted_intersection(*[tables[p].ids.tolist() for p in [label, *peers]])
    at = dict(zip([label, *peers], rows))
    aligned = {p: {k: v[at[p]] for k, v in own_rows(loaded[p][1]["meta"], tables[p]).items()} for p in at}
    lay = job_layout(name)
    if name == "f3":   # every owner's h through the coordinator's part (the holders export nothing)
        coord = next(p for p in exported if p not in tables)
        module, doc = load_export(exported[coord], registry.get_algorithm)
        hs = {f"h_{p}": score(loaded[p][0], loaded[p][1]["meta"], aligned[p]) for p in at}
        return order, score(module, doc["meta"], hs).astype(np.float64)
    contributions = {}
    for g in peers if (lay.contribution or lay.exchange) else []:
        module, doc = loaded[g]
        if name == "he_split":
            from fedhet.algorithms.he_split.model import share
            from fedhet.algorithms.he_split.predict import layer_output
            contributions[g] = layer_output(s, score(module, doc["meta"], aligned[g]),
                                            share(exported_weights(exported[label]), f"share.{g}"),
                                            share(exported_weights(exported[g]), "share"))
        else:
            contributions[g] = lay.contribution(module, doc["meta"], aligned[g])
    return order, lay.combine(loaded[label][0], loaded[label][1]["meta"], aligned[label], contributions)


# ------------------------------------------------------------------------------------ one algorithm
def one(name: str, n: int, folder: Path, backend: str = "auto") -> dict[str, Any]:
    fed = smoke(name)
    models = train(fed, folder / "run")
    exported = export_run(folder / "run", folder / "export", registry.get_algorithm, onnx=False)
    rng = np.random.default_rng(0)
    host = next(p.name for p in fed.parties if p.role == "host")
    spec = {}
    for p in fed.parties:
        ids = [f"r{i}" for i in range(n)]
        if p.name != host:   # a guest lacks 1 % of the IDs and holds as many of its own
            ids = [i for k, i in enumerate(ids) if k % 100 != 7] + [f"g{k}" for k in range(n // 100)]
            ids = [ids[k] for k in rng.permutation(len(ids))]
        spec[p.name] = write_rows(models[p.name].meta, ids, folder / f"{p.name}.csv", rng)
    pfed = replace(fed, parties=[replace(p, data=spec[p.name]) for p in fed.parties], base_dir=str(folder))
    out = folder / "pred"
    t0 = time.perf_counter()
    job = job_federation(pfed, folder / "run", out)
    job = replace(job, algorithm={**job.algorithm, "predict_psi_backend": backend})
    run = harness.launch_audited(job, run_dir=out, keep=True, timeout=1800)
    wall = time.perf_counter() - t0
    res = run.results[host]
    role_s = run.summary["parties"][host].get("role_wall_s")
    ids_fed, _, probs_fed = read_predictions(out / "parties" / host / PREDICTIONS)

    tables = {p.name: load_party_table(TableSpec.from_dict(spec[p.name], party=p.name, base_dir=folder))
              for p in fed.parties}
    loaded = {p: load_export(exported[p], registry.get_algorithm) for p in tables}
    s = registry.get_algorithm(name).parse(fed.algorithm_cfg())

    def plaintext():
        return plaintext_vertical(name, s, tables, loaded, exported, host)

    t = harness.best_of(plaintext, repeats=3)
    order, probs = t.result
    same = [str(i) for i in order] == ids_fed and np.array_equal(np.asarray(probs, np.float64), probs_fed)
    k = int(res["n_predicted"])
    return {"algorithm": name, "rows_per_party": n, "n_predicted": k, "n_missing": res["n_missing"],
            "parties": len(fed.parties), "federated_wall_s": wall, "federated_rows_per_s": k / wall,
            "label_role_s": role_s, "label_role_rows_per_s": (k / role_s) if role_s else None,
            "psi_backend_setting": backend, "psi_backend": res.get("psi_backend"),
            "label_psi_s": res.get("psi_s"), "label_exchange_s": res.get("exchange_s"),
            "label_score_s": res.get("score_s"),
            "plaintext_s": t.wall_s, "plaintext_rows_per_s": k / t.wall_s,
            "slowdown_wall": wall / t.wall_s, "slowdown_role": (role_s / t.wall_s) if role_s else None,
            "identical": bool(same), "audit_ok": run.audit_ok, "audit_problems": run.audit_problems[:5],
            "he": getattr(s, "he", None), "key_bits": getattr(s, "key_bits", None)}


def job_layout(name: str):
    from importlib import import_module
    return import_module(installed_entry_points()[name].module + ".predict").LAYOUT


def exported_weights(folder: Path) -> dict:
    """The tensors of an export folder (its weights.safetensors)."""
    from safetensors.numpy import load_file
    return load_file(str(folder / "weights.safetensors"))


# ------------------------------------------------------------------------------------ results
def render(doc: dict) -> str:
    lines = ["# Prediction throughput: `fedhet predict` (vertical, as processes) beside plaintext inference", "",
             "Each algorithm's smoke model; every party its own process (CURVE ZeroMQ), PSI over the new rows' "
             "IDs (`predict_psi_backend`: the PSI column says the setting and the backend that ran), then the "
             "declared exchange; the job audited.  Plaintext: the same rows aligned in one process "
             "and scored with the exported modules (best of 3).  *Job* is the launcher's wall time (process start, "
             "torch import, keys, PSI, exchange, CSV); *label role* the label party's role alone (its PSI, with the "
             "extra per-party PSI where there are several feature parties; the exchange: receiving the codes, or the "
             "encrypted layer's batches; its own scoring and the CSV files).", "",
             "| algorithm | PSI | rows / party | predicted | missing | job s | job rows/s | label role s (PSI + exchange + "
             "scoring and CSV) | label role rows/s | plaintext s | plaintext rows/s | job / plaintext "
             "| role / plaintext | same predictions | audit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        name = r["algorithm"] + (f" ({r['he']}, {r['key_bits']}-bit)" if r.get("he") else "")
        role = r["label_role_s"]
        lines.append(
            f"| {name} | {_psi(r)} | {r['rows_per_party']:,} | {r['n_predicted']:,} | {r['n_missing']} | "
            f"{r['federated_wall_s']:.2f} | {r['federated_rows_per_s']:,.0f} | {role:.2f} ({_parts(r)}) | "
            f"{r['label_role_rows_per_s']:,.0f} | "
            f"{r['plaintext_s']:.4f} | {r['plaintext_rows_per_s']:,.0f} | {r['slowdown_wall']:,.0f}x | "
            f"{r['slowdown_role']:,.0f}x | {'yes' if r['identical'] else 'NO'} | "
            f"{'ok' if r['audit_ok'] else r['audit_problems']} |")
    lines += ["", harness.environment_line(doc.get("environment"))]
    return "\n".join(lines) + "\n"


def _psi(r: dict) -> str:
    """The PSI setting and the backend that ran (results from before the setting: ECDH)."""
    setting, ran = r.get("psi_backend_setting"), r.get("psi_backend") or "ecdh"
    return ran if setting in (None, ran) else f"{setting}: {ran}"


def _parts(r: dict) -> str:
    if r.get("label_psi_s") is None:
        return "?"
    return f"{r['label_psi_s']:.2f} + {r['label_exchange_s']:.2f} + {r['label_score_s']:.2f}"


def main(argv=None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__), render_only=True)
    ap.add_argument("--rows", type=int, nargs=2, metavar=("STFL", "HE_SPLIT"), default=None,
                    help="new rows per party (default 20000 and 1000; --quick 2000 and 256)")
    ap.add_argument("--psi-backends", nargs="+", default=["auto"], metavar="BACKEND",
                    help="predict_psi_backend values, each run in turn (default auto; e.g. ecdh auto: before/after)")
    a = ap.parse_args(argv)
    out = harness.Output("predict_throughput", a.quick, a.out)
    if a.render_only:
        harness.render_only(out, render)
        return 0
    sess = harness.Session("predict_throughput", __file__, argv)
    rows = dict(zip(ALGORITHMS, a.rows or ((2000, 256) if a.quick else (20000, 1000))))
    doc: dict[str, Any] = {"runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        for name in ALGORITHMS:
            for backend in a.psi_backends:
                folder = Path(tmp) / f"{name}-{backend}"
                folder.mkdir()
                doc["runs"].append(one(name, rows[name], folder, backend))
                r = doc["runs"][-1]
                print(f"{name} {_psi(r)}: {r['rows_per_party']} rows, label PSI {r['label_psi_s']:.2f} s, "
                      f"job {r['federated_wall_s']:.1f} s", flush=True)
    return harness.publish(out, doc, render, sess)


if __name__ == "__main__":
    raise SystemExit(main())
