"""Bit-identity captures for refactorings (a helper of tests/, run by hand; not a test module).

    python tests/identity_captures.py before.json          # on the commit before the change
    python tests/identity_captures.py after.json --compare before.json

Runs every installed algorithm's smoke federation and four presets (demo, chfl_small, f3_small,
psi) in memory, and writes, for each, the SHA-256 of its results (timings, byte counts and pool
statistics left out: ``algorithm_tools.comparable``) and its trained parts (tensors and metadata).
Left out as fresh randomness by design: secret-share tensors (``share.*``) and a part's self-check
outputs (``meta["check"]``, computed from them).  ``--compare`` exits 1 naming every capture
that differs.  Issue 44's restructuring kept all 14 identical.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from algorithm_tools import comparable, jsonable, smoke_federation  # noqa: E402  (a helper module of tests/)

from fedhet.algorithms import registry  # noqa: E402
from fedhet.parties.federation import load  # noqa: E402
from fedhet.parties.inmemory import run_inmemory  # noqa: E402
from fedhet.parties.ops import presets  # noqa: E402

PRESETS = ("demo", "chfl_small", "f3_small", "psi")


def digest(fed, checkpoints: Path) -> str:
    models: dict = {}
    res = run_inmemory(registry.get_algorithm(fed.algorithm_name), [(p.name, p.role) for p in fed.parties],
                       fed.algorithm_cfg(), seed=fed.seed, run_id="capture", timeout=300, models=models,
                       checkpoint_dir=checkpoints)
    h = hashlib.sha256(json.dumps(comparable(jsonable(res)), sort_keys=True).encode())
    for name in sorted(models):
        part = models[name]
        h.update(json.dumps(jsonable({k: v for k, v in part.meta.items() if k != "check"}), sort_keys=True).encode())
        for k in sorted(t for t in part.tensors if not t.startswith("share.")):
            a = np.ascontiguousarray(part.tensors[k])
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--compare", type=Path, help="an earlier capture file: exit 1 where a capture differs")
    args = ap.parse_args(argv)
    jobs = [(f"smoke:{n}", lambda n=n: smoke_federation(n)) for n in registry.names()]
    jobs += [(f"preset:{p}", lambda p=p: load(presets.path(p))) for p in PRESETS]
    out = {}
    for label, federation in jobs:
        with tempfile.TemporaryDirectory() as tmp:
            out[label] = digest(federation(), Path(tmp))
        print(label, out[label], flush=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    differ = sorted(k for k in set(before) | set(out) if before.get(k) != out.get(k))
    print(f"{len(out) - len(differ)} of {len(out)} captures identical" + (f"; differ: {differ}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
