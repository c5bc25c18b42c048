"""SecretFlow SPU's two-party PSI (``spu.psi.psi_execute``) on generated IDs, for ``benchmarks/peers.py``.

Runs under whatever interpreter has ``spu`` (it pins numpy < 2, so it usually lives in a venv of its
own, not fedhet's): it imports nothing of fedhet.  Usage::

    SPU_PYTHON benchmarks/spu_psi.py PROTOCOL N [PORT]     # PROTOCOL: KKRT or RR22

Two processes (ranks 0 and 1) over SPU's brpc link on 127.0.0.1, each with a CSV of N IDs
``id-<12 digits>``, half of them common (fedhet's side of the comparison runs its ``psi`` job's own
generated ID strings, the same shape: N per side, half common); receiver rank 0, result broadcast.  Prints one JSON line: each rank's wall and CPU
seconds of ``psi_execute`` (which reads the input CSV and writes the output CSV), the intersection
size, and the bytes that crossed the loopback interface during the run (``/proc/net/dev``, both
directions, TCP/IP headers included: the machine must be otherwise quiet on loopback).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import tempfile
import time


def _party(rank: int, protocol: str, paths: list[str], port: int, q) -> None:
    import spu.libspu.link as link
    from spu import psi

    desc = link.Desc()
    desc.id = "fedhet-peers-psi"
    desc.recv_timeout_ms = 600_000
    for r in range(2):
        desc.add_party(f"p{r}", f"127.0.0.1:{port + r}")
    lctx = link.create_brpc(desc, rank)
    cfg = psi.PsiExecuteConfig(
        protocol_conf=psi.PsiProtocolConfig(protocol=getattr(psi.PsiProtocol, f"PROTOCOL_{protocol}"),
                                            receiver_rank=0, broadcast_result=True),
        input_params=psi.InputParams(path=paths[rank], selected_keys=["id"], keys_unique=True),
        output_params=psi.OutputParams(path=paths[rank] + ".out", disable_alignment=True))
    lctx.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    rep = psi.psi_execute(cfg, lctx)
    q.put({"rank": rank, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
           "size": rep.intersection_count})
    lctx.stop_link()


def _loopback_bytes() -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            if line.strip().startswith("lo:"):
                return int(line.split(":", 1)[1].split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def main(argv: list[str]) -> int:
    protocol, n = argv[0].upper(), int(argv[1])
    port = int(argv[2]) if len(argv) > 2 else 29400
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, "a.csv"), os.path.join(d, "b.csv")]
        for path, ids in zip(paths, (range(n), range(n // 2, n + n // 2))):
            with open(path, "w") as f:
                f.write("id\n" + "".join(f"id-{i:012d}\n" for i in ids))
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        lo0 = _loopback_bytes()
        procs = [ctx.Process(target=_party, args=(r, protocol, paths, port, q)) for r in range(2)]
        for p in procs:
            p.start()
        ranks = sorted((q.get(timeout=900) for _ in procs), key=lambda x: x["rank"])
        for p in procs:
            p.join()
        lo = _loopback_bytes() - lo0
    import spu

    print(json.dumps({"protocol": protocol, "n": n, "ranks": ranks, "loopback_bytes": lo,
                      "expected_size": n - n // 2, "version": spu.__version__}))
    return 0 if all(r["size"] == n - n // 2 for r in ranks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
