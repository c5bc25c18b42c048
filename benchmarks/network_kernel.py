"""The link emulator against the kernel (issue 48): bandwidth shaped by ``tbf`` between two network
namespaces against the emulator's bandwidth model, and the round trip a ping-pong measures under the
emulator against the configured one.

Two ZmqParty processes (CURVE on) exchange messages: ``a`` sends a message of N bytes, ``b`` answers
a 1-byte acknowledgement, ``a`` times send to acknowledgement.

- **kernel**: ``a`` and ``b`` in two network namespaces joined by a veth pair whose both ends are
  shaped by ``tc qdisc ... tbf rate R`` (no simulated link in the parties);
- **emulator**: both on loopback with ``network = "0,R"`` (no latency, bandwidth R);
- **model**: N * 8 / R.

Then ping-pongs of a few bytes on loopback with ``network = "RTT,10000"`` at 1, 10 and 100 ms. This
machine's kernel has no ``netem``, so the kernel cannot add a delay to compare the round trips with:
the ping-pong checks the emulator's round trip against its configuration only.  Needs root and
iproute2 (``ip netns``, ``tc``) for the kernel rows; they are reported as not run otherwise.

    python -m benchmarks.network_kernel
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

NAME = "network_kernel"
ROLES = {"a": "server", "b": "client"}
MBIT = 100                                    # the shaped bandwidth, Mbit/s
SIZES = (1 << 20, 4 << 20, 16 << 20)          # bytes per message (large: the rate dominates)
RTTS_MS = (1.0, 10.0, 100.0)
PINGS = 20
REPEATS = 3
TAG = f"fhk{os.getpid() % 10000}"


# ------------------------------------------------------------------------ one party (a child process)

def child(args: argparse.Namespace) -> int:
    import numpy as np

    from fedhet.parties.netlink import parse_network
    from fedhet.parties.zmq_transport import ZmqParty

    cfg = json.loads(Path(args.config).read_text())
    keys = {n: (k[0].encode(), k[1].encode()) for n, k in cfg["keys"].items()}
    net = parse_network(cfg["network"])
    p = ZmqParty(args.child, ROLES, cfg["endpoints"], public_keys={n: k[0] for n, k in keys.items()},
                 secret_key=keys[args.child][1], run_id="network-kernel", timeout=300, network=net,
                 bind_endpoint=cfg["bind"][args.child])
    try:
        sizes = cfg["sizes"]
        if args.child == "b":
            for _ in range(1 + len(sizes)):
                p.recv("a", "blob")
                p.send("a", "ack", 0)
            return 0
        p.send("b", "blob", np.zeros(1, np.uint8))   # the connections made, the first handshake done
        p.recv("b", "ack")
        times = []
        for n in sizes:
            blob = np.zeros(n, np.uint8)
            t0 = time.perf_counter()
            p.send("b", "blob", blob)
            p.recv("b", "ack")
            times.append(time.perf_counter() - t0)
        print(json.dumps({"seconds": times}), flush=True)
        return 0
    finally:
        p.close()


def pair(endpoints: dict, bind: dict, network: str, sizes: list[int], wrap: dict[str, list[str]]) -> list[float]:
    """Start ``b`` then ``a`` (each under ``wrap[name]``, e.g. ``ip netns exec NS``); a's timings."""
    import zmq

    with tempfile.TemporaryDirectory(prefix="netkernel-") as d:
        keys = {n: [k.decode() for k in zmq.curve_keypair()] for n in ROLES}
        cfg = Path(d) / "cfg.json"
        cfg.write_text(json.dumps({"keys": keys, "endpoints": endpoints, "bind": bind, "network": network,
                                   "sizes": sizes}))
        cmd = [sys.executable, "-m", "benchmarks.network_kernel", "--config", str(cfg), "--child"]
        env = dict(os.environ, PYTHONPATH=str(harness.REPO))
        b = subprocess.Popen(wrap["b"] + cmd + ["b"], cwd=harness.REPO, env=env)
        try:
            out = subprocess.run(wrap["a"] + cmd + ["a"], cwd=harness.REPO, env=env, capture_output=True,
                                 text=True, timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"party a failed: {out.stderr[-2000:]}")
            b.wait(timeout=60)
        finally:
            if b.poll() is None:
                b.kill()
        return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def loopback(network: str, sizes: list[int]) -> list[float]:
    from fedhet.parties.ops.engines.local import free_port

    eps = {n: f"tcp://127.0.0.1:{free_port()}" for n in ROLES}
    return pair(eps, eps, network, sizes, {n: [] for n in ROLES})


# ------------------------------------------------------------------------------ namespaces

def _run(*cmd: str) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def netns_ready() -> str | None:
    """Why namespaces cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2's ip and tc"
    return None


def kernel(sizes: list[int]) -> list[float]:
    ns = {n: f"{TAG}{n}" for n in ROLES}
    sub = f"10.232.{os.getpid() % 250}"
    addr = {"a": f"{sub}.1", "b": f"{sub}.2"}
    try:
        for n in ROLES:
            _run("ip", "netns", "add", ns[n])
        _run("ip", "link", "add", f"{TAG}va", "type", "veth", "peer", "name", f"{TAG}vb")
        for n in ROLES:
            dev = f"{TAG}v{n}"
            _run("ip", "link", "set", dev, "netns", ns[n])
            _run("ip", "-n", ns[n], "addr", "add", f"{addr[n]}/24", "dev", dev)
            _run("ip", "-n", ns[n], "link", "set", dev, "up")
            _run("ip", "-n", ns[n], "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns[n], "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                 f"{MBIT}mbit", "burst", "128kb", "latency", "400ms")
        eps = {n: f"tcp://{addr[n]}:{27000 + i}" for i, n in enumerate(ROLES)}
        return pair(eps, eps, "loopback", sizes, {n: ["ip", "netns", "exec", ns[n]] for n in ROLES})
    finally:
        for n in ROLES:
            subprocess.run(["ip", "netns", "del", ns[n]], capture_output=True, timeout=30)


def ping_rtts(rtt_ms: float | None) -> list[float]:
    """Round trips of 8-byte messages under ``rtt_ms`` (None: loopback, no simulated link)."""
    return loopback("loopback" if rtt_ms is None else f"{rtt_ms:g},10000", [8] * PINGS)


# -------------------------------------------------------------------------------- results

def markdown(doc: dict) -> str:
    lines = ["# The link emulator against the kernel", "",
             f"A message of N bytes from party a to party b (CURVE), timed from a's send to b's 1-byte answer, "
             f"at {doc['mbit']} Mbit/s: kernel = two network namespaces over a veth pair shaped by `tbf`; "
             "emulator = loopback with `network = \"0,R\"`; model = N * 8 / R. Error: emulator against kernel. "
             f"Each size {REPEATS} times, the least time kept.", "",
             "| MB | model s | kernel s | emulator s | emulator vs kernel |", "|---|---|---|---|---|"]
    for r in doc["bandwidth"]:
        k = r.get("kernel_s")
        err = None if k is None else (r["emulator_s"] - k) / k
        lines.append(f"| {r['bytes'] / 2**20:g} | {r['model_s']:.3f} | {harness.dash(k, '{:.3f}')} | "
                     f"{r['emulator_s']:.3f} | {harness.dash(err, '{:+.1%}')} |")
    if doc.get("kernel_not_run"):
        lines += ["", f"Kernel rows not run: {doc['kernel_not_run']}."]
    base = (doc.get("loopback_rtt_ms") or {}).get("median_ms", 0.0)
    lines += ["", f"Ping-pong of 8-byte messages on loopback under the emulator ({PINGS} round trips each; "
              "no `netem` in this kernel, so no kernel row). The same ping-pong without a simulated link takes "
              f"{base:.2f} ms (median): the parties' own send, receive and wake-up time, which a real link adds "
              "to its round trip too; added = median - that.", "",
              "| configured RTT ms | median ms | min ms | max ms | median vs configured | added vs configured |",
              "|---|---|---|---|---|---|"]
    for r in doc["rtt"]:
        med = r["median_ms"]
        lines.append(f"| {r['rtt_ms']:g} | {med:.2f} | {r['min_ms']:.2f} | {r['max_ms']:.2f} | "
                     f"{(med - r['rtt_ms']) / r['rtt_ms']:+.1%} | {(med - base - r['rtt_ms']) / r['rtt_ms']:+.1%} |")
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=harness.RESULTS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    session = harness.Session(NAME, __file__, argv)
    out = harness.Output(NAME, False, args.out)
    sizes = [n for n in SIZES for _ in range(REPEATS)]   # each size REPEATS times; the least time kept
    doc: dict = {"mbit": MBIT, "bandwidth": [], "rtt": [], "kernel_not_run": netns_ready()}
    emu = loopback(f"0,{MBIT}", sizes)
    ker = None
    if doc["kernel_not_run"] is None:
        try:
            ker = kernel(sizes)
        except (RuntimeError, subprocess.SubprocessError) as e:
            doc["kernel_not_run"] = f"{type(e).__name__}: {str(e)[:300]}"
    for n in SIZES:
        at = [i for i, m in enumerate(sizes) if m == n]
        doc["bandwidth"].append({"bytes": n, "model_s": n * 8 / (MBIT * 1e6), "emulator_s": min(emu[i] for i in at),
                                 "kernel_s": None if ker is None else min(ker[i] for i in at),
                                 "emulator_all_s": [emu[i] for i in at],
                                 "kernel_all_s": None if ker is None else [ker[i] for i in at]})
    base = [t * 1e3 for t in ping_rtts(None)]
    doc["loopback_rtt_ms"] = {"median_ms": statistics.median(base), "all_ms": base}
    for rtt in RTTS_MS:
        ts = [t * 1e3 for t in ping_rtts(rtt)]
        doc["rtt"].append({"rtt_ms": rtt, "median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts),
                           "all_ms": ts})
    return harness.publish(out, doc, markdown, session)


if __name__ == "__main__":
    raise SystemExit(main())
