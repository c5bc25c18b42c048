"""The HE interactive layer with CKKS (TenSEAL, approximate): scheme "ckks".

Both sides of one link for the CKKS scheme of :mod:`fedhet.protocols.he_interactive` (read it for the
per-batch protocol and what each side learns); :mod:`fedhet.crypto.ckks` without Galois keys.
``A_g`` is flattened row-major and repeated ``m`` times in one ciphertext (:class:`CKKSLayout`); the
host multiplies slot-wise by plaintext patterns of ``W_g`` / ``delta`` and adds a float mask per
slot; the guest decrypts and does the sums over features / samples itself on masked values.

Approximate: float masks uniform over ``+-ckks_mask`` (default ``2**10``, FATE's own noise range)
because CKKS values must stay below ``2**19``; this is not statistical hiding, and CKKS results
decrypted by the key owner would additionally need noise flooding (the CKKS error term depends on
the host's inputs), which is not done here.  Precision: parameter set "fast" (scale ``2**40``); the
layer output is within ``d * (ABS_TOL_FRESH + REL_TOL_MUL * (|A W_g| + ckks_mask))`` of the plain
product by ``crypto.ckks``'s stated bounds, measured about ``1e-5`` absolute for ``d = 8`` and
``|A W| ~ 100``.  TenSEAL is imported when a side is set up, not when this module is.
"""
from __future__ import annotations

import secrets
import time
from typing import Any, Callable

import numpy as np

from fedhet.parties.api import PartyError, ProtocolMismatch
from fedhet.parties.contract import PartyLike

from .he_encoding import LayerSpec, count_clipped
from .he_link import Kind, LayerStats, fault, recv_timed

__all__ = ["CKKSLayout", "CKKSGuest", "CKKSHost"]


class CKKSLayout:
    """Flattened row-major activations (rows x d), repeated m times, split into ciphertext chunks."""

    def __init__(self, rows: int, d: int, K: int, slots: int):
        self.rows, self.d, self.K = rows, d, K
        self.L = rows * d
        self.m = max(1, min(K, slots // self.L))
        self.groups = -(-K // self.m)
        self.total = self.m * self.L
        self.slots = slots
        self.chunks = -(-self.total // slots)

    def cols(self, g: int) -> list[int]:
        return [g * self.m + t for t in range(self.m)]

    def split(self, v: np.ndarray) -> list[np.ndarray]:
        return [v[c * self.slots:(c + 1) * self.slots] for c in range(self.chunks)]

    def per_col(self, g: int, make: Callable[[int], np.ndarray]) -> np.ndarray:
        """Concatenate make(k) (length L) for the m columns of group g; zeros past K."""
        parts = [make(k) if k < self.K else np.zeros(self.L) for k in self.cols(g)]
        return np.concatenate(parts)


class CKKSGuest:
    """Guest side (key owner): encrypts its activations and noise, sums masked products over features / samples."""

    def __init__(self, party: PartyLike, host: str, spec: LayerSpec, d: int, width: int):
        self.party, self.host, self.spec = party, host, spec
        self.d, self.K = int(d), int(width)
        self.stats = LayerStats()
        self.eps = np.zeros((self.d, self.K))
        self._A: np.ndarray | None = None

    def setup(self) -> None:
        from fedhet.crypto import ckks

        self.ck = ckks
        t0 = time.perf_counter()
        self.ctx = ckks.make_context(self.spec.ckks_params, galois_keys=False)
        self.slots = ckks.slot_count(self.ctx)
        self.stats.s_encrypt += time.perf_counter() - t0
        key = np.frombuffer(ckks.public_context_bytes(self.ctx), dtype=np.uint8).copy()
        self.party.send(self.host, Kind.PUBKEY, {"scheme": "ckks", "key": key})

    def close(self) -> None:
        pass

    def _enc(self, v: np.ndarray, lay: CKKSLayout) -> list[np.ndarray]:
        out = [self.ck.to_wire(self.ck.encrypt_vector(self.ctx, c)) for c in lay.split(v)]
        self.stats.encrypted += len(out)
        return out

    def _dec(self, msg: list[np.ndarray], lay: CKKSLayout, groups: int, what: str) -> list[np.ndarray]:
        """Decrypt groups x chunks vectors into `groups` arrays of length m*L."""
        if len(msg) != groups * lay.chunks:
            raise fault(self.party, self.host, what, f"expected {groups * lay.chunks} CKKS vectors")
        t0 = time.perf_counter()
        out = []
        for g in range(groups):
            try:
                parts = [self.ck.decrypt_vector(self.ck.from_wire(self.ctx, a)) for a in
                         msg[g * lay.chunks:(g + 1) * lay.chunks]]
            except ValueError as e:
                raise fault(self.party, self.host, what, str(e)) from None
            v = np.concatenate(parts)[:lay.total]
            if v.size != lay.total or not np.all(np.isfinite(v)):
                raise fault(self.party, self.host, what, f"CKKS vectors decrypt to {v.size} values (expected "
                            f"{lay.total}) or to NaN / inf")
            out.append(v)
        self.stats.decrypted += len(msg)
        self.stats.s_decrypt += time.perf_counter() - t0
        return out

    def forward(self, A: np.ndarray, train: bool) -> None:
        A = np.asarray(A, dtype=np.float64)
        if A.ndim != 2 or A.shape[1] != self.d:
            raise ValueError(f"guest activations must have shape (rows, {self.d}), got {A.shape}")
        if not np.all(np.isfinite(A)) or (A.size and np.max(np.abs(A)) >= 2.0 ** self.spec.a_int_bits):
            raise ValueError("guest bottom-model output must be finite with |A| < 2**a_int_bits")
        b = A.shape[0]
        lay = self.lay = CKKSLayout(b, self.d, self.K, self.slots)
        self._A = A
        t0 = time.perf_counter()
        cts = self._enc(np.tile(A.ravel(), lay.m), lay)
        self.stats.s_encrypt += time.perf_counter() - t0
        self.party.send(self.host, Kind.ACTS, {"rows": b, "ckks": cts})
        if train:
            t0 = time.perf_counter()
            cts = []
            for g in range(lay.groups):
                cts += self._enc(lay.per_col(g, lambda k: np.tile(self.eps[:, k], b)), lay)
            self.stats.s_encrypt += time.perf_counter() - t0
            self.party.send(self.host, Kind.NOISE, cts)
        vs = self._dec(recv_timed(self.party, self.host, Kind.FWD_CT, self.stats), lay, lay.groups, Kind.FWD_CT)
        S = np.zeros((self.K, b))
        for g, v in enumerate(vs):
            sums = v.reshape(lay.m, b, self.d).sum(axis=2)  # sum over features of masked products
            for t, k in enumerate(lay.cols(g)):
                if k < self.K:
                    S[k] = sums[t]
        masked = S.T + A @ self.eps  # (b, K): A W + masks
        self.party.send(self.host, Kind.FWD_MASKED, masked.astype(np.float64))

    def backward(self) -> np.ndarray:
        if self._A is None:
            raise PartyError("backward without a training forward")
        lay, b, s = self.lay, self._A.shape[0], self.spec
        vs = self._dec(recv_timed(self.party, self.host, Kind.GRAD_CT, self.stats), lay, lay.groups, Kind.GRAD_CT)
        GT = np.zeros((self.K, self.d))
        for g, v in enumerate(vs):
            sums = v.reshape(lay.m, b, self.d).sum(axis=1)  # sum over samples
            for t, k in enumerate(lay.cols(g)):
                if k < self.K:
                    GT[k] = sums[t]
        rng = np.random.default_rng(secrets.randbits(128))
        nu = rng.uniform(-s.ckks_mask, s.ckks_mask, size=GT.shape)
        self.party.send(self.host, Kind.GRAD_MASKED, (GT + nu).astype(np.float64))
        (v,) = self._dec(recv_timed(self.party, self.host, Kind.INGRAD_CT, self.stats), lay, 1, Kind.INGRAD_CT)
        g = v.reshape(lay.m, b, self.d).sum(axis=0)  # partial sums over interactive units per copy
        self.eps = self.eps + (s.lr / b) * nu.T
        self._A = None
        return g / b


class CKKSHost:
    """Host side: multiplies the guest's CKKS vectors by plaintext patterns of W_g / delta and masks them."""

    def __init__(self, party: PartyLike, guest: str, spec: LayerSpec, W_init: np.ndarray):
        self.party, self.guest, self.spec = party, guest, spec
        self.W = np.array(W_init, dtype=np.float64)
        self.d, self.K = self.W.shape
        self.stats = LayerStats()
        self.rows = 0
        self.C: list[Any] | None = None
        self._delta: np.ndarray | None = None

    def setup(self) -> None:
        from fedhet.crypto import ckks

        self.ck = ckks
        msg = self.party.recv(self.guest, Kind.PUBKEY)  # {"scheme", "key"}: checked against its schema
        if msg["scheme"] != "ckks":
            raise ProtocolMismatch(self.party.name, self.guest, "HE scheme", "ckks", msg["scheme"])
        try:
            self.ctx = ckks.context_from_bytes(np.asarray(msg["key"], dtype=np.uint8).tobytes())
        except ValueError as e:
            raise fault(self.party, self.guest, Kind.PUBKEY, str(e)) from None
        if self.ctx.is_private():
            raise fault(self.party, self.guest, Kind.PUBKEY, "the context holds the guest's secret key")
        self.slots = ckks.slot_count(self.ctx)

    def close(self) -> None:
        pass

    def true_weight_share(self) -> np.ndarray:
        return self.W.copy()

    def _vecs(self, arrs: list[np.ndarray], count: int, what: str) -> list[Any]:
        if len(arrs) != count:
            raise fault(self.party, self.guest, what, f"expected {count} CKKS vectors")
        try:
            return [self.ck.from_wire(self.ctx, a) for a in arrs]
        except ValueError as e:
            raise fault(self.party, self.guest, what, str(e)) from None

    def _noise(self, n: int) -> np.ndarray:
        rng = np.random.default_rng(secrets.randbits(128))
        return rng.uniform(-self.spec.ckks_mask, self.spec.ckks_mask, size=n)

    def _send(self, kind: str, vecs: list[Any]) -> None:
        t0 = time.perf_counter()
        wire = [self.ck.to_wire(v) for v in vecs]
        self.stats.s_compute += time.perf_counter() - t0
        self.party.send(self.guest, kind, wire)

    def _products(self, pattern: Callable[[int], np.ndarray], sum_axis: int) -> tuple[list[Any], np.ndarray]:
        """For each group: C * pattern(g) + per-slot noise; returns vectors and the noise sums (K, .)."""
        lay, C = self.lay, self._acts()
        out, sums = [], {}
        for g in range(lay.groups):
            P = pattern(g)
            N = self._noise(lay.total)
            for c, (Pc, Nc) in enumerate(zip(lay.split(P), lay.split(N))):
                out.append(C[c] * Pc.tolist() + Nc.tolist())
            red = N.reshape(lay.m, lay.rows, lay.d).sum(axis=sum_axis)
            for t, k in enumerate(lay.cols(g)):
                if k < self.K:
                    sums[k] = red[t]
        return out, np.stack([sums[k] for k in range(self.K)])

    def _acts(self) -> list[Any]:
        if self.C is None:
            raise PartyError("no activations received for this batch")
        return self.C

    def recv_acts(self) -> None:
        # {"rows": 1..batch_size, "ckks": [vectors]}: its schema checked fields and bounds
        msg = recv_timed(self.party, self.guest, Kind.ACTS, self.stats)
        self.rows = int(msg["rows"])
        self.lay = CKKSLayout(self.rows, self.d, self.K, self.slots)
        self.C = self._vecs(msg["ckks"], self.lay.chunks, Kind.ACTS)

    def send_forward(self) -> None:
        lay = self.lay
        t0 = time.perf_counter()
        vecs, self._n_fwd = self._products(lambda g: lay.per_col(g, lambda k: np.tile(self.W[:, k], lay.rows)), 2)
        self.stats.s_compute += time.perf_counter() - t0
        self._send(Kind.FWD_CT, vecs)

    def recv_forward(self) -> np.ndarray:
        # float64 (rows, K), finite: its schema checked all but the rows
        masked = np.asarray(recv_timed(self.party, self.guest, Kind.FWD_MASKED, self.stats), dtype=np.float64)
        if masked.shape != (self.rows, self.K):
            raise fault(self.party, self.guest, Kind.FWD_MASKED, f"shape {masked.shape}, expected ({self.rows}, "
                        f"{self.K})")
        return masked - self._n_fwd.T

    def send_gradient(self, delta_ps: np.ndarray) -> None:
        lim = 2.0 ** self.spec.d_int_bits
        self.stats.delta_clipped += count_clipped(delta_ps, self.spec)
        delta = self._delta = np.clip(np.asarray(delta_ps, dtype=np.float64), -lim, lim)
        lay = self.lay
        t0 = time.perf_counter()
        vecs, self._n_grad = self._products(
            lambda g: lay.per_col(g, lambda k: np.repeat(delta[:, k], lay.d)), 1)
        self.stats.s_compute += time.perf_counter() - t0
        self._send(Kind.GRAD_CT, vecs)

    def finish_backward(self) -> None:
        lay, delta = self.lay, self._delta
        if delta is None:
            raise PartyError("finish_backward before send_gradient")
        # float64 (K, d), finite: checked against its schema
        M = np.asarray(recv_timed(self.party, self.guest, Kind.GRAD_MASKED, self.stats), dtype=np.float64)
        M = M - self._n_grad
        E = self._vecs(recv_timed(self.party, self.guest, Kind.NOISE, self.stats), lay.groups * lay.chunks, Kind.NOISE)
        t0 = time.perf_counter()
        acc: list[Any] = [None] * lay.chunks
        for g in range(lay.groups):
            Q = lay.split(lay.per_col(g, lambda k: np.repeat(delta[:, k], lay.d)))
            for c in range(lay.chunks):
                term = E[g * lay.chunks + c] * Q[c].tolist()
                acc[c] = term if acc[c] is None else acc[c] + term
        plain = np.zeros(lay.total)
        plain[:lay.L] = (delta @ self.W.T).ravel()  # delta W_g^T, in copy 0 only
        acc = [a + p.tolist() for a, p in zip(acc, lay.split(plain))]
        self.stats.s_compute += time.perf_counter() - t0
        self._send(Kind.INGRAD_CT, acc)
        self.W = self.W - (self.spec.lr / self.rows) * M.T
        self._delta = self.C = None
