"""Transport cost: CURVE-encrypted ZeroMQ vs plain TCP (``--insecure``), side by side.

Two processes on loopback (the peers are started with multiprocessing's
``spawn``: this script measures the transport itself, below any protocol, so
it builds the ``ZmqParty`` objects directly rather than through the launcher,
whose start-up, transcripts and audit are not what is measured here), six
channels (three layers, CURVE on and off) open at once and measured interleaved, so machine noise hits every variant alike:

* ``party``: two ``ZmqParty`` objects, the path algorithms use (codec,
  SHA-256 digest for the transcript on both sides, sequence checks, the
  receiver's copy out of the socket buffer), CURVE on and off;
* ``raw``: a bare DEALER -> ROUTER pair with the same CURVE settings and
  zero-copy sends, CURVE on and off: libzmq's own cost, no fedhet code;
* ``chunked``: as ``raw``, but the tensor goes as 1 MiB frames of one
  multipart message.  libzmq encrypts (and decrypts) each frame as a whole
  into freshly allocated buffers, so one huge frame is encrypted completely
  before its first byte is sent and decrypted only after its last byte came;
  small frames pipeline encryption, transfer and decryption and stay in cache.

Rows: round-trip time of a small message (median over many pings) and, for
float32 tensors of 1 MiB ... 256 MiB, the time from ``send`` until the peer's
small acknowledgement is back (best of the repeats) as throughput, with the
CURVE / plain ratio of each layer; plus single-core speeds of CURVE's
cipher, two other AEADs, SHA-256 and a memory copy, which explain the ratios.

    python -m benchmarks.transport           # 1, 4, 16, 64, 256 MiB
    python -m benchmarks.transport --quick   # 1, 4, 16 MiB, fewer repeats

Writes benchmarks/results/transport.json and transport.md
(``transport_quick.*`` with --quick), atomically.
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np
import zmq

from benchmarks import harness
from fedhet.parties.ops.engines.local import free_port
RUN = "transport-bench"
ROLES = {"a": "bench", "b": "bench"}
LAYERS = ["party", "raw", "chunked"]
CHANNELS = [(layer, sec) for layer in LAYERS for sec in ("curve", "plain")]
CHUNK = 1 << 20  # frame size of the ``chunked`` layer
MAX_BYTES = 1 << 30


def _quiet() -> logging.Logger:
    log = logging.getLogger("fedhet.bench.transport")
    log.setLevel(logging.ERROR)
    return log


def _party(name: str, sec: str, keys: dict, endpoints: dict):
    import warnings

    from fedhet.parties.zmq_transport import InsecureTransportWarning, ZmqParty

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureTransportWarning)
        return ZmqParty(name, ROLES, endpoints, public_keys={n: k[0] for n, k in keys.items()},
                        secret_key=keys[name][1], insecure=sec == "plain", run_id=RUN, timeout=600,
                        max_message_bytes=MAX_BYTES, logger=_quiet())


# ------------------------------------------------------------- the peer (b)
def _peer(layer: str, sec: str, keys: dict, endpoints: dict, ready) -> None:
    """Echo an acknowledgement (the byte count) for every message until 'stop'."""
    if layer == "party":
        p = _party("b", sec, keys, endpoints)
        ready.send("up")
        while True:
            m = p.recv("a", "m", timeout=3600)
            if m["op"] == "stop":
                break
            p.send("a", "r", int(m["x"].nbytes) if m["op"] == "blob" else 0)
        p.close(timeout=10)
        return
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.linger = 0
    r.maxmsgsize = MAX_BYTES
    if sec == "curve":
        r.curve_server = True
        r.curve_publickey, r.curve_secretkey = keys["b"]
    r.bind(endpoints["b"])
    ready.send("up")
    while True:
        ident, *parts = r.recv_multipart(copy=False)
        if parts[0].bytes == b"stop":
            break
        r.send_multipart([ident, str(sum(len(p.buffer) for p in parts)).encode()])
    ctx.destroy(linger=0)


# ----------------------------------------------------------- the driver (a)
class Channel:
    def __init__(self, layer: str, sec: str, spawn) -> None:
        self.layer, self.sec = layer, sec
        self.keys = {n: zmq.curve_keypair() for n in ROLES}
        self.endpoints = {n: f"tcp://127.0.0.1:{free_port()}" for n in ROLES}
        here, there = spawn.Pipe()
        self.proc = spawn.Process(target=_peer, args=(layer, sec, self.keys, self.endpoints, there), daemon=True)
        self.proc.start()
        if not here.poll(300) or here.recv() != "up":
            raise RuntimeError(f"peer for {layer}/{sec} did not start")
        if layer == "party":
            self.p = _party("a", sec, self.keys, self.endpoints)
        else:
            self.ctx = zmq.Context()
            self.s = self.ctx.socket(zmq.DEALER)
            self.s.linger = 0
            self.s.sndhwm = 0
            if sec == "curve":
                self.s.curve_serverkey = self.keys["b"][0]
                self.s.curve_publickey, self.s.curve_secretkey = self.keys["a"]
            self.s.connect(self.endpoints["b"])

    @property
    def name(self) -> str:
        return f"{self.layer}/{self.sec}"

    def exchange(self, x: np.ndarray | None) -> float:
        """Seconds from sending (x, or a ping) until the acknowledgement is back."""
        t = time.perf_counter()
        if self.layer == "party":
            self.p.send("b", "m", {"op": "ping"} if x is None else {"op": "blob", "x": x})
            n = self.p.recv("b", "r", timeout=600)
        elif x is None:
            self.s.send(b"ping")
            n = int(self.s.recv())
        else:
            if self.layer == "raw":
                self.s.send(x, copy=False)
            else:  # the same bytes as consecutive CHUNK-sized frames of one message
                mv = memoryview(x).cast("B")
                self.s.send_multipart([mv[i:i + CHUNK] for i in range(0, len(mv), CHUNK)], copy=False)
            n = int(self.s.recv())
        dt = time.perf_counter() - t
        if n != (0 if x is None else x.nbytes) and not (self.layer != "party" and x is None):
            raise RuntimeError(f"{self.name}: peer acknowledged {n} bytes")
        return dt

    def close(self) -> None:
        if self.layer == "party":
            self.p.send("b", "m", {"op": "stop"})
            self.p.close(timeout=10)
        else:
            self.s.send(b"stop")
            self.ctx.destroy(linger=1000)
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def run(sizes_mb: list[int], pings: int, repeats: int) -> dict:
    spawn = mp.get_context("spawn")
    chans = [Channel(layer, sec, spawn) for layer, sec in CHANNELS]
    try:
        for c in chans:  # handshake and first-touch costs out of the way
            for _ in range(20):
                c.exchange(None)
        rtt = {c.name: [] for c in chans}
        for _ in range(max(1, pings // 50)):
            for c in chans:
                rtt[c.name] += [c.exchange(None) for _ in range(50)]
        tput: dict[int, dict[str, list[float]]] = {}
        for mb in sizes_mb:
            x = np.full((mb << 20) // 4, 1.5, dtype=np.float32)
            tput[mb] = {c.name: [] for c in chans}
            for c in chans:
                c.exchange(x)  # warm-up: buffers of this size
            for _ in range(repeats):
                for c in chans:
                    tput[mb][c.name].append(c.exchange(x))
            del x
            print(f"  {mb:>4} MiB: " + ", ".join(f"{n} {mb * 1.048576 / min(v):.0f} MB/s" for n, v in tput[mb].items()),
                  file=sys.stderr)
    finally:
        for c in chans:
            try:
                c.close()
            except Exception as e:  # keep closing the others
                print(f"closing {c.name}: {e}", file=sys.stderr)
    return {"rtt": rtt, "tput": tput}


def cipher_rates(repeats: int) -> list[dict]:
    """One core, 1 MiB buffers: CURVE's cipher against the alternatives and a plain hash/copy."""
    import hashlib

    import nacl.bindings as nb
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    m, k = os.urandom(1 << 20), os.urandom(32)
    n24, n12 = os.urandom(24), os.urandom(12)
    gcm, chacha = AESGCM(k), ChaCha20Poly1305(k)
    buf = np.frombuffer(m, np.uint8)
    cases = [("XSalsa20-Poly1305 (libsodium secretbox, what CURVE uses)", lambda: nb.crypto_secretbox(m, n24, k)),
             ("ChaCha20-Poly1305 (cryptography)", lambda: chacha.encrypt(n12, m, None)),
             ("AES-256-GCM (cryptography)", lambda: gcm.encrypt(n12, m, None)),
             ("SHA-256 (transcript digest)", lambda: hashlib.sha256(m).digest()),
             ("memory copy (numpy)", lambda: buf.copy())]
    rows = []
    for name, f in cases:
        best = float("inf")
        for _ in range(max(3, repeats)):
            t = time.perf_counter()
            for _ in range(32):
                f()
            best = min(best, time.perf_counter() - t)
        rows.append({"what": name, "MBps": 32 * len(m) / best / 1e6})
    return rows


def summarise(raw: dict, sizes_mb: list[int]) -> tuple[list[dict], list[dict]]:
    rtt_rows = []
    for layer in LAYERS:
        med = {s: statistics.median(raw["rtt"][f"{layer}/{s}"]) for s in ("curve", "plain")}
        q = {s: statistics.quantiles(raw["rtt"][f"{layer}/{s}"], n=10) for s in ("curve", "plain")}
        rtt_rows.append({"layer": layer, "curve_us": med["curve"] * 1e6, "plain_us": med["plain"] * 1e6,
                         "curve_p10_p90_us": [q["curve"][0] * 1e6, q["curve"][-1] * 1e6],
                         "plain_p10_p90_us": [q["plain"][0] * 1e6, q["plain"][-1] * 1e6],
                         "curve_over_plain": med["curve"] / med["plain"],
                         "samples": len(raw["rtt"][f"{layer}/curve"])})
    tput_rows = []
    for mb in sizes_mb:
        nbytes = mb << 20
        for layer in LAYERS:
            best = {s: min(raw["tput"][mb][f"{layer}/{s}"]) for s in ("curve", "plain")}
            rate = {s: nbytes / best[s] / 1e6 for s in best}  # MB/s, 10^6 bytes
            tput_rows.append({"size_mb": mb, "layer": layer, "curve_s": best["curve"], "plain_s": best["plain"],
                              "curve_MBps": rate["curve"], "plain_MBps": rate["plain"],
                              "curve_over_plain": rate["curve"] / rate["plain"],
                              "repeats": len(raw["tput"][mb][f"{layer}/curve"])})
    return rtt_rows, tput_rows


def render_md(meta: dict, rtt_rows: list[dict], tput_rows: list[dict], ciphers: list[dict]) -> str:
    out = [f"# Transport: CURVE vs plain TCP on loopback{' (QUICK)' if meta['quick'] else ''}", "",
           f"Machine: {meta['machine']}; libzmq {meta['libzmq']}, pyzmq {meta['pyzmq']}; "
           f"{meta['date']}. Two processes per channel, six channels measured interleaved in one run. "
           "`party` = ZmqParty send/recv (codec, SHA-256 transcript digests, receiver copy); "
           "`raw` = bare DEALER/ROUTER, zero-copy send, the tensor as one frame; "
           "`chunked` = the same but the tensor split into 1 MiB frames of one message (what chunking "
           "in the codec would give at the socket level). Throughput = size / best time from send "
           "to the peer's acknowledgement (MB = 10^6 bytes; sizes are MiB).", "",
           "## Round trip, small message (median)", "",
           "| layer | CURVE µs | plain µs | CURVE / plain |", "|---|---:|---:|---:|"]
    for r in rtt_rows:
        out.append(f"| {r['layer']} | {r['curve_us']:.0f} | {r['plain_us']:.0f} | {r['curve_over_plain']:.2f} |")
    out += ["", "## Throughput, float32 tensor", "",
            "| size | layer | CURVE MB/s | plain MB/s | CURVE / plain |", "|---:|---|---:|---:|---:|"]
    for r in tput_rows:
        out.append(f"| {r['size_mb']} MiB | {r['layer']} | {r['curve_MBps']:.0f} | {r['plain_MBps']:.0f} | "
                   f"{r['curve_over_plain']:.2f} |")
    big = [r for r in tput_rows if r["size_mb"] == max(x["size_mb"] for x in tput_rows)]
    out += ["", "Largest tensor: " + "; ".join(
        f"{r['layer']} keeps {r['curve_over_plain']:.0%} of plain-TCP throughput with CURVE" for r in big)
        + " (goal: at least 50%).", "",
        "## Per-byte costs on this machine (one core, 1 MiB buffers)", "",
        "| operation | MB/s |", "|---|---:|"]
    out += [f"| {c['what']} | {c['MBps']:.0f} |" for c in ciphers]
    out += ["", f"Best of {meta['repeats']} interleaved repeats per size; on a shared machine single rows "
            "are noisy, the ratios within a row less so.", ""]
    env = harness.environment_line(meta.get("environment"))
    if env:
        out += [env, ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_common_args(ap, quick_help="1-16 MB, fewer repeats")
    ap.add_argument("--sizes", type=int, nargs="*", help="tensor sizes in MiB")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--pings", type=int)
    args = ap.parse_args(argv)
    sizes = args.sizes or ([1, 4, 16] if args.quick else [1, 4, 16, 64, 256])
    repeats = args.repeats or (3 if args.quick else 5)
    pings = args.pings or (500 if args.quick else 2000)
    if any(s <= 0 or s > 512 for s in sizes):
        raise SystemExit("--sizes must be between 1 and 512 MiB")
    session = harness.Session("transport", __file__, argv)
    env = session.meta
    meta = {"quick": args.quick, "sizes_mib": sizes, "repeats": repeats, "pings": pings,
            "machine": f"{env['machine']}, {env['cpu_count_os']} CPUs, {env['platform']}",
            "libzmq": zmq.zmq_version(), "pyzmq": zmq.__version__, "python": env["python"],
            "date": session.started, "command": session.command}
    print(f"transport benchmark: sizes {sizes} MiB, {repeats} repeats, {pings} pings", file=sys.stderr)
    raw = run(sizes, pings, repeats)
    rtt_rows, tput_rows = summarise(raw, sizes)
    ciphers = cipher_rates(repeats)
    meta["environment"] = session.finish()
    md = render_md(meta, rtt_rows, tput_rows, ciphers)
    harness.Output("transport", quick=args.quick, out_dir=args.out).write(
        {"meta": meta, "rtt": rtt_rows, "throughput": tput_rows, "per_byte": ciphers, "transfer_s": raw["tput"]}, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
