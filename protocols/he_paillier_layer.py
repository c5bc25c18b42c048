"""The HE interactive layer on exact integers: schemes "paillier" (packed) and "naive" (one value per ciphertext).

Both sides of one link for the integer schemes of :mod:`fedhet.protocols.he_interactive` (read it for
the per-batch protocol and what each side learns); the numbers are encoded as in
:mod:`fedhet.protocols.he_encoding`.  The two schemes share :class:`IntegerGuest` (the key owner) and
:class:`IntegerHost` and differ only in their operations object:

* :class:`PackedOps` (``paillier``): packed, batched Paillier (:mod:`fedhet.crypto.paillier`),
  ``slot_bits``-bit slots (``"auto"``: sized from the public parameters and the link's widths,
  :func:`fedhet.protocols.he_encoding.slot_budget`; both sides resolve it in their constructors and
  refuse ciphertexts packed in another width).  ``[[A_g]]`` goes twice, packed along the batch (forward: one ciphertext
  row per feature) and along the features (gradient: one row per sample), because packed slots
  cannot be summed inside a ciphertext.  Obfuscators are precomputed by background threads on both
  sides, in the form ``LayerSpec.obfuscation`` (default ``"short_exponent"``: DJN ``h**x`` from fixed-base
  tables, CRT at the key owner; ``"standard"``: ``r**n``; see :mod:`fedhet.crypto.paillier_keys` for the
  assumption each rests on; decrypted values are the same).  Each side draws its own public base ``h``.
  Products with plaintext integer matrices are multi-exponentiations on exact integers
  (:func:`fedhet.crypto.paillier.packed_matmul_ints`); fresh encryptions of integers wider than a
  float64 go through the float API as exact digits.
* :class:`NaiveOps` (``naive``): ``phe`` ``EncryptedNumber`` objects, one value per ciphertext, no
  pools; the same integers and masks, so the comparison shows what packing and batching buy.
"""
from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from fedhet.crypto import paillier as pl
from fedhet.crypto.fixedpoint import dequantize
from fedhet.parties.api import PartyError, ProtocolMismatch
from fedhet.parties.contract import PartyLike

from .he_encoding import (
    DIGIT_BITS,
    LayerSpec,
    SlotOverflowError,
    count_clipped,
    decode_masked,
    digits,
    encode_masked,
    int_bound,
    int_dot,
    max_abs_int,
    quantize,
    quantize_acts,
    quantize_delta,
    uniform_ints,
    weight_step,
)
from .he_link import Kind, LayerStats, fault, recv_timed

__all__ = ["IntegerOps", "PackedOps", "NaiveOps", "IntegerGuest", "IntegerHost", "slot_overflow"]


def slot_overflow(what: str, spec: LayerSpec, why: str, need: int | None = None) -> SlotOverflowError:
    """The error when values outgrow the slots: the interactive weights grew past what the width allows."""
    want = f"slot_bits >= {need}" if need else "a larger slot_bits"
    return SlotOverflowError(
        f"{what}: {why}; the interactive weights outgrew {spec.slot_bits}-bit slots, which an auto width sizes "
        f"for max_steps={spec.max_steps} training steps: raise max_steps (he_split: he_max_steps) or set {want}")


def _unpack_signed(residues: list, n: int, slot_bits: int, slots: int, length: int) -> list[int]:
    """Decrypted packed plaintexts -> signed slot integers (crypto.paillier's packing, inverted)."""
    try:
        return pl.unpack_signed(residues, n, slot_bits, slots, length)
    except ValueError as e:
        raise PartyError(str(e)) from None


class IntegerOps(Protocol):
    """What the integer layer needs of a scheme: exact-integer matrix operations on its ciphertexts."""

    two_layouts: bool  # True: [[A]] goes in both packings (packed slots cannot be summed inside a ciphertext)

    def count(self, rows: int, length: int) -> int: ...
    def encrypt(self, ints: np.ndarray, bound_bits: int | None = None) -> Any: ...
    def matmul(self, enc: Any, W: np.ndarray) -> Any: ...
    def add_ints(self, enc: Any, ints: np.ndarray) -> Any: ...
    def rerandomize(self, enc: Any) -> Any: ...
    def decrypt(self, enc: Any) -> np.ndarray: ...
    def n_ct(self, enc: Any) -> int: ...
    def to_wire(self, enc: Any, include_bound: bool) -> dict: ...
    def from_wire(self, msg: Any, what: str) -> Any: ...


class PackedOps:
    """Exact-integer matrix operations on packed Paillier ciphertexts (crypto.paillier)."""

    two_layouts = True  # packed slots cannot be summed inside a ciphertext: send [[A]] both ways

    def __init__(self, ctx: "pl.PaillierContext", spec: LayerSpec):
        self.ctx, self.spec = ctx, spec
        self.pk = ctx.public_key
        self.n = int(self.pk.n)
        self.slot_bits, self.slots = pl.PackingSpec(0, 1, int(spec.slot_bits)).layout(ctx.key_bits)

    def count(self, rows: int, length: int) -> int:
        return rows * -(-length // self.slots)

    def encrypt(self, ints: np.ndarray, bound_bits: int | None = None) -> "pl.EncryptedArray":
        ints = np.asarray(ints, dtype=object)
        top = max_abs_int(ints)
        bits = max(bound_bits or 0, top.bit_length(), 1)
        if bits <= DIGIT_BITS:
            spec = pl.PackingSpec(frac_bits=0, int_bits=bits, slot_bits=self.slot_bits)
            return self.ctx.encrypt(ints.astype(np.float64), spec)
        ds = digits(ints)
        spec = pl.PackingSpec(frac_bits=0, int_bits=DIGIT_BITS, slot_bits=self.slot_bits)
        enc = self.ctx.encrypt(ds[0], spec)
        for t, d in enumerate(ds[1:], 1):
            enc = enc.add_plain(np.ldexp(d, DIGIT_BITS * t))
        # A power-of-two public bound: says no more than the magnitude's bit length.
        return pl.EncryptedArray(self.pk, enc.ciphertexts, enc.shape, spec, 0, 1 << bits)

    def matmul(self, enc, W: np.ndarray):
        """``Y[k, :] = sum_j W[j, k] X[j, :]`` for integer W of any size (exact)."""
        W = np.asarray(W, dtype=object)
        return pl.packed_matmul_ints(enc, np.vectorize(int, otypes=[object])(W) if W.size else W,
                                     w_frac_bits=0, executor=self.ctx.executor)

    def add_ints(self, enc, ints: np.ndarray):
        for t, d in enumerate(digits(ints)):
            if np.any(d):
                enc = enc.add_plain(np.ldexp(d, DIGIT_BITS * t - enc.frac_bits))
        return enc

    def rerandomize(self, enc):
        return self.ctx.rerandomize(enc)

    def decrypt(self, enc) -> np.ndarray:
        ms = self.ctx.decrypt_raw(enc.ciphertexts.ravel())
        n_ct = enc.n_ct_per_row
        rows = [_unpack_signed(ms[i * n_ct:(i + 1) * n_ct], self.n, enc.slot_bits, enc.slots, enc.length)
                for i in range(enc.rows)]
        return np.array(rows, dtype=object).reshape(enc.rows, enc.length)

    def n_ct(self, enc) -> int:
        return enc.n_ciphertexts

    def to_wire(self, enc, include_bound: bool) -> dict:
        meta, arr = enc.to_wire(include_bound=include_bound)
        return {"meta": meta, "ct": arr}

    def from_wire(self, msg, what: str):
        """The received ciphertexts; ValueError saying what is wrong (the caller names the sender)."""
        try:
            enc = pl.EncryptedArray.from_wire(self.pk, msg["meta"], msg["ct"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed ciphertexts: {e}") from None
        if enc.slot_bits != self.slot_bits:
            raise ValueError(f"ciphertexts packed in {enc.slot_bits}-bit slots, expected {self.slot_bits} "
                             "(both sides derive slot_bits from the same settings)")
        return enc


class NaiveOps:
    """The same operations with python-paillier, one ``EncryptedNumber`` per value."""

    two_layouts = False

    def __init__(self, public_key, private_key, spec: LayerSpec):
        from phe import paillier as phe_paillier

        self._phe = phe_paillier
        self.pk, self.sk, self.spec = public_key, private_key, spec
        self.key_bits = int(public_key.n.bit_length())

    def count(self, rows: int, length: int) -> int:
        return rows * length

    def encrypt(self, ints: np.ndarray, bound_bits: int | None = None) -> np.ndarray:
        ints = np.asarray(ints, dtype=object)
        out = np.empty(ints.shape, dtype=object)
        for idx in np.ndindex(ints.shape):
            out[idx] = self.pk.encrypt(int(ints[idx]))
        return out

    def matmul(self, X: np.ndarray, W: np.ndarray) -> np.ndarray:
        r, L = X.shape
        K = W.shape[1]
        Y = np.empty((K, L), dtype=object)
        for k in range(K):
            acc = None
            for j in range(r):
                w = int(W[j, k])
                if w == 0:
                    continue
                term = [x * w for x in X[j]]
                acc = term if acc is None else [a + t for a, t in zip(acc, term)]
            if acc is None:
                acc = [self.pk.encrypt(0, r_value=1) for _ in range(L)]
            Y[k] = acc
        return Y

    def add_ints(self, Y: np.ndarray, ints: np.ndarray) -> np.ndarray:
        out = np.empty(Y.shape, dtype=object)
        for idx in np.ndindex(Y.shape):
            out[idx] = Y[idx] + int(ints[idx])
        return out

    def rerandomize(self, Y: np.ndarray) -> np.ndarray:
        for y in Y.ravel():
            y.obfuscate()
        return Y

    def decrypt(self, Y: np.ndarray) -> np.ndarray:
        out = np.empty(Y.shape, dtype=object)
        for idx in np.ndindex(Y.shape):
            out[idx] = int(self.sk.decrypt(Y[idx]))
        return out

    def n_ct(self, Y) -> int:
        return int(Y.size)

    def to_wire(self, Y: np.ndarray, include_bound: bool = False) -> dict:
        cts = [y.ciphertext(be_secure=False) for y in Y.ravel()]
        return {"meta": {"shape": list(Y.shape)}, "ct": pl.ciphertexts_to_bytes(cts, self.pk)}

    def from_wire(self, msg, what: str) -> np.ndarray:
        """The received ciphertexts; ValueError saying what is wrong (the caller names the sender)."""
        try:
            shape = tuple(int(s) for s in msg["meta"]["shape"])
            cts = pl.ciphertexts_from_bytes(msg["ct"], self.pk)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed ciphertexts: {e}") from None
        if len(shape) != 2 or len(cts) != shape[0] * shape[1]:
            raise ValueError(f"{len(cts)} ciphertexts do not fill shape {shape}")
        out = np.empty(len(cts), dtype=object)
        for i, c in enumerate(cts):
            out[i] = self._phe.EncryptedNumber(self.pk, int(c), 0)
        return out.reshape(shape)


class IntegerGuest:
    """Guest side (key owner) for "paillier" and "naive"."""

    def __init__(self, party: PartyLike, host: str, spec: LayerSpec, d: int, width: int):
        self.d, self.K = int(d), int(width)
        self.party, self.host, self.spec = party, host, spec.resolve(self.d, self.K)
        self.stats = LayerStats()
        self.eps = np.zeros((self.d, self.K), dtype=object)  # accumulated noise, w grid
        self._A: np.ndarray | None = None
        self._ctx: pl.PaillierContext | None = None
        self.ops: IntegerOps

    def setup(self) -> None:
        t0 = time.perf_counter()
        if self.spec.scheme == "paillier":
            ctx = pl.PaillierContext.generate(self.spec.key_bits, workers=self.spec.workers,
                                              obfuscation=self.spec.obfuscation, kappa=self.spec.kappa)
            pk = ctx.public_key
            self._ctx, self.ops = ctx, _packed(ctx, self.spec, (self.d, self.spec.batch_size),
                                               (self.spec.batch_size, self.d), (self.K, self.d))
        else:
            pk, sk = pl.generate_keypair(self.spec.key_bits)
            self.ops = NaiveOps(pk, sk, self.spec)
        self.stats.s_encrypt += time.perf_counter() - t0
        key = np.frombuffer(pl.public_key_to_bytes(pk), dtype=np.uint8).copy()
        self.party.send(self.host, Kind.PUBKEY, {"scheme": self.spec.scheme, "key": key})

    def close(self) -> None:
        _close(self._ctx)

    # -- forward
    def forward(self, A: np.ndarray, train: bool) -> None:
        """Send [[A]] (and [[eps]] when training), finish the masked forward for the host."""
        s, st = self.spec, self.stats
        A_int = quantize_acts(A, s)
        if A_int.ndim != 2 or A_int.shape[1] != self.d:
            raise ValueError(f"guest activations must have shape (rows, {self.d}), got {A_int.shape}")
        b = A_int.shape[0]
        if b > s.batch_size:
            raise ValueError(f"batch of {b} rows exceeds batch_size={s.batch_size} (the public gradient bound)")
        self._A = A_int
        t0 = time.perf_counter()
        msg = {"rows": b}
        if self.ops.two_layouts:
            msg["fwd"] = self.ops.to_wire(self.ops.encrypt(A_int.T, s.a_bound_bits), True)
            st.encrypted += self.ops.count(self.d, b)
            if train:
                msg["grad"] = self.ops.to_wire(self.ops.encrypt(A_int, s.a_bound_bits), True)
                st.encrypted += self.ops.count(b, self.d)
        else:
            msg["all"] = self.ops.to_wire(self.ops.encrypt(A_int, s.a_bound_bits), True)
            st.encrypted += self.ops.count(b, self.d)
        st.s_encrypt += time.perf_counter() - t0
        self.party.send(self.host, Kind.ACTS, msg)
        if train:
            # [[eps]] now: its encryption overlaps the host's forward work; eps only changes after backward.
            t0 = time.perf_counter()
            try:
                enc = self.ops.encrypt(self.eps.T)
            except pl.PackingOverflowError as e:
                raise slot_overflow("weight noise eps", s, str(e)) from None
            st.encrypted += self.ops.count(self.K, self.d)
            st.s_encrypt += time.perf_counter() - t0
            self.party.send(self.host, Kind.NOISE, self.ops.to_wire(enc, True))
        if self._ctx is not None:
            st.pool_misses = int(self._ctx.pool.misses)
        ct = self._recv_ct(Kind.FWD_CT)
        t0 = time.perf_counter()
        dec = self.ops.decrypt(ct)  # (K, b): A W_g + e_B
        st.decrypted += self.ops.n_ct(ct)
        st.s_decrypt += time.perf_counter() - t0
        if dec.shape != (self.K, b):
            raise fault(self.party, self.host, Kind.FWD_CT, f"expected ({self.K}, {b}) values, got {dec.shape}")
        masked = dec + int_dot(self.eps.T, A_int.T)  # + A eps: now A W + e_B
        self.party.send(self.host, Kind.FWD_MASKED, encode_masked(masked, s.masked_bytes))

    def _recv_ct(self, kind: str) -> Any:
        """The host's ciphertexts of ``kind``, checked (units mod n**2, layout); PeerFault naming the host."""
        msg = recv_timed(self.party, self.host, kind, self.stats)
        try:
            return self.ops.from_wire(msg, kind)
        except ValueError as e:
            raise fault(self.party, self.host, kind, str(e)) from None

    # -- backward
    def backward(self) -> np.ndarray:
        """Masked weight gradient for the host; returns dL/dA (rows x d, mean over the batch)."""
        s, st = self.spec, self.stats
        if self._A is None:
            raise PartyError("backward without a training forward")
        b = self._A.shape[0]
        ct = self._recv_ct(Kind.GRAD_CT)
        t0 = time.perf_counter()
        dec = self.ops.decrypt(ct)  # (K, d): G^T + e_W
        st.decrypted += self.ops.n_ct(ct)
        st.s_decrypt += time.perf_counter() - t0
        if dec.shape != (self.K, self.d):
            raise fault(self.party, self.host, Kind.GRAD_CT, f"expected ({self.K}, {self.d}) values, got {dec.shape}")
        nu = uniform_ints(dec.shape, s.mask_bits + s.grad_bits(b))  # sized by rows: steps of eps do not grow
        self.party.send(self.host, Kind.GRAD_MASKED, encode_masked(dec + nu, s.masked_bytes))
        ct = self._recv_ct(Kind.INGRAD_CT)
        t0 = time.perf_counter()
        g = self.ops.decrypt(ct)  # (b, d): delta W^T, frac d_frac + w_frac
        st.decrypted += self.ops.n_ct(ct)
        st.s_decrypt += time.perf_counter() - t0
        if g.shape != (b, self.d):
            raise fault(self.party, self.host, Kind.INGRAD_CT, f"expected ({b}, {self.d}) values, got {g.shape}")
        self.eps = self.eps + weight_step(nu, b, s).T
        self._A = None
        scale = 2.0 ** -(s.d_frac_bits + s.w_frac_bits) / b
        return dequantize(g, 0) * scale


class IntegerHost:
    """Host side (label owner, computes on the guest's ciphertexts) for "paillier" and "naive"."""

    def __init__(self, party: PartyLike, guest: str, spec: LayerSpec, W_init: np.ndarray):
        self.party, self.guest = party, guest
        W_init = np.asarray(W_init, dtype=np.float64)
        self.d, self.K = W_init.shape
        self.spec = spec = spec.resolve(self.d, self.K)
        self.W = quantize(W_init, spec.w_frac_bits, "initial interactive weights")  # the host's masked copy W_g
        self.stats = LayerStats()
        self._ctx: pl.PaillierContext | None = None
        self.ops: IntegerOps
        self.rows = 0
        self.X_fwd: Any = None
        self.X_grad: Any = None
        self._delta: np.ndarray | None = None
        self._e_fwd: np.ndarray | None = None
        self._e_grad: np.ndarray | None = None

    def setup(self) -> None:
        msg = self.party.recv(self.guest, Kind.PUBKEY)  # {"scheme", "key"}: checked against its schema
        if msg["scheme"] != self.spec.scheme:  # differing settings, not proven malice: nobody is named
            raise ProtocolMismatch(self.party.name, self.guest, "HE scheme", self.spec.scheme, msg["scheme"])
        try:
            pk = pl.public_key_from_bytes(np.asarray(msg["key"], dtype=np.uint8).tobytes())
        except ValueError as e:
            raise fault(self.party, self.guest, Kind.PUBKEY, str(e)) from None
        if pk.n.bit_length() != self.spec.key_bits:
            raise ProtocolMismatch(self.party.name, self.guest, "Paillier key bits", self.spec.key_bits,
                                   pk.n.bit_length())
        if self.spec.scheme == "paillier":
            ctx = pl.PaillierContext(pk, None, workers=self.spec.workers,
                                     obfuscation=self.spec.obfuscation, kappa=self.spec.kappa)
            self._ctx, self.ops = ctx, _packed(ctx, self.spec, (self.K, self.spec.batch_size), (self.K, self.d),
                                               (self.spec.batch_size, self.d))
        else:
            self.ops = NaiveOps(pk, None, self.spec)

    def close(self) -> None:
        _close(self._ctx)

    def true_weight_share(self) -> np.ndarray:
        """The host's share W_g as floats (the true weight is W_g + eps; eps only the guest knows)."""
        return dequantize(self.W, self.spec.w_frac_bits)

    def _margin(self, bound: int, what: str) -> None:
        """Check, before any work, that a mask over +-2**(slot_bits-2) hides values below ``bound`` by mask_bits."""
        s, st = self.spec, self.stats
        bits = int(bound).bit_length()
        sigma = (self.slot_bits - 2) - bits
        st.max_bound_bits = max(st.max_bound_bits, bits)
        if sigma < s.mask_bits:
            raise slot_overflow(what, s, f"values need {bits} bits, so a mask in {s.slot_bits}-bit slots hides "
                                f"them by only {sigma} < mask_bits={s.mask_bits} bits", bits + s.mask_bits + 2)
        st.min_mask_sigma = sigma if st.min_mask_sigma is None else min(st.min_mask_sigma, sigma)

    def _mask(self, enc: Any) -> tuple[Any, np.ndarray]:
        """Add the host's mask, uniform over +-2**(slot_bits-2) (its margin checked by ``_margin``)."""
        noise = uniform_ints(tuple(enc.shape), self.slot_bits - 2)
        return self.ops.add_ints(enc, noise), noise

    @property
    def slot_bits(self) -> int:
        """The resolved slot width (the constructor resolved an auto width)."""
        return int(self.spec.slot_bits)

    def _send_ct(self, kind: str, enc: Any) -> None:
        t0 = time.perf_counter()
        enc = self.ops.rerandomize(enc)
        self.stats.rerandomized += self.ops.n_ct(enc)
        self.stats.s_rerandomize += time.perf_counter() - t0
        if self._ctx is not None:
            self.stats.pool_misses = int(self._ctx.pool.misses)
        self.party.send(self.guest, kind, self.ops.to_wire(enc, False))

    # -- forward
    def recv_acts(self) -> None:
        # {"rows": 1..batch_size, and "fwd" (+ "grad") or "all"}: its schema checked fields and bounds
        msg = recv_timed(self.party, self.guest, Kind.ACTS, self.stats)
        self.rows = int(msg["rows"])
        try:
            if self.ops.two_layouts:
                self.X_fwd = self.ops.from_wire(msg.get("fwd"), Kind.ACTS)
                self.X_grad = self.ops.from_wire(msg["grad"], Kind.ACTS) if "grad" in msg else None
            else:
                X = self.ops.from_wire(msg.get("all"), Kind.ACTS)
                self.X_fwd, self.X_grad = X.T, X
        except ValueError as e:
            raise fault(self.party, self.guest, Kind.ACTS, str(e)) from None
        if tuple(self.X_fwd.shape) != (self.d, self.rows) or (
                self.X_grad is not None and tuple(self.X_grad.shape) != (self.rows, self.d)):
            raise fault(self.party, self.guest, Kind.ACTS, f"activations of shape {tuple(self.X_fwd.shape)}, "
                        f"expected ({self.d}, {self.rows})")
        if self.spec.scheme == "paillier" and self.X_fwd.bound > 1 << self.spec.a_bound_bits:
            raise fault(self.party, self.guest, Kind.ACTS, "slot bound exceeds 2**(a_int_bits + a_frac_bits)")

    def send_forward(self) -> None:
        t0 = time.perf_counter()
        self._margin(int_bound(self.spec.a_bound_bits, self.W), "forward")
        Y = self.ops.matmul(self.X_fwd, self.W)  # (K, rows)
        Y, self._e_fwd = self._mask(Y)
        self.stats.s_compute += time.perf_counter() - t0
        self._send_ct(Kind.FWD_CT, Y)

    def recv_forward(self) -> np.ndarray:
        """The guest part of the layer output, A_g W (rows x K), exact on the 2**-(a_frac+w_frac) grid."""
        arr = recv_timed(self.party, self.guest, Kind.FWD_MASKED, self.stats)
        try:
            masked = decode_masked(arr, self.spec.masked_bytes, (self.K, self.rows))
        except PartyError as e:
            raise fault(self.party, self.guest, Kind.FWD_MASKED, str(e)) from None
        Z = masked - self._e_fwd
        self._e_fwd = None
        return dequantize(Z.T, self.spec.a_frac_bits + self.spec.w_frac_bits)

    # -- backward
    def send_gradient(self, delta_ps: np.ndarray) -> None:
        """delta_ps: per-sample dL/dz (rows x K), i.e. the batch-mean gradient times rows."""
        if self.X_grad is None:
            raise PartyError("send_gradient after a forward without training activations")
        t0 = time.perf_counter()
        self.stats.delta_clipped += count_clipped(delta_ps, self.spec)
        self._delta = quantize_delta(delta_ps, self.spec)
        if self._delta.shape != (self.rows, self.K):
            raise ValueError(f"delta must have shape ({self.rows}, {self.K}), got {self._delta.shape}")
        self._margin(int_bound(self.spec.a_bound_bits, self._delta), "weight gradient")
        Y = self.ops.matmul(self.X_grad, self._delta)  # (K, d): G^T
        Y, self._e_grad = self._mask(Y)
        self.stats.s_compute += time.perf_counter() - t0
        self._send_ct(Kind.GRAD_CT, Y)

    def finish_backward(self) -> None:
        """Unmask G + nu, send [[delta W^T]] (old weights), then W_g -= step(G + nu)."""
        s = self.spec
        if self._delta is None:
            raise PartyError("finish_backward before send_gradient")
        arr = recv_timed(self.party, self.guest, Kind.GRAD_MASKED, self.stats)
        try:
            M = decode_masked(arr, s.masked_bytes, (self.K, self.d)) - self._e_grad
        except PartyError as e:
            raise fault(self.party, self.guest, Kind.GRAD_MASKED, str(e)) from None
        try:
            enc_eps = self.ops.from_wire(recv_timed(self.party, self.guest, Kind.NOISE, self.stats), Kind.NOISE)
        except ValueError as e:
            raise fault(self.party, self.guest, Kind.NOISE, str(e)) from None
        if tuple(enc_eps.shape) != (self.K, self.d):
            raise fault(self.party, self.guest, Kind.NOISE, f"shape {tuple(enc_eps.shape)}, expected ({self.K}, {self.d})")
        t0 = time.perf_counter()
        try:
            Y = self.ops.matmul(enc_eps, self._delta.T)  # (rows, d): delta eps^T
            Y = self.ops.add_ints(Y, int_dot(self._delta, self.W.T))  # + delta W_g^T
        except pl.PackingOverflowError as e:
            raise slot_overflow("input gradient", s, str(e)) from None
        self.stats.s_compute += time.perf_counter() - t0
        self._send_ct(Kind.INGRAD_CT, Y)
        self.W = self.W - weight_step(M, self.rows, s).T
        self._delta = self._e_grad = self.X_grad = self.X_fwd = None


def _packed(ctx: pl.PaillierContext, spec: LayerSpec, *layouts: tuple[int, int]) -> PackedOps:
    """The packed operations on ``ctx``; with ``spec.pool``, a background pool of the obfuscators one
    batch needs, the ciphertexts of the ``(rows, length)`` layouts this side encrypts or rerandomizes."""
    ops = PackedOps(ctx, spec)
    if spec.pool:
        ctx.start_background_pool(sum(ops.count(r, n) for r, n in layouts))
    return ops


def _close(ctx: pl.PaillierContext | None) -> None:
    if ctx is not None:
        ctx.close()
