"""Secure aggregation: Bonawitz et al. (CCS 2017), with the SecAgg+ graph of Bell et al. (CCS 2020).

The server learns ``sum_u w_u * clip(x_u)`` and ``sum_u w_u`` over the clients
that completed the round, and nothing else about any single ``x_u`` or ``w_u``:
what it receives from a client is a vector masked with uniformly random ring
elements, and Shamir shares it can open only for the masks the protocol lets
it remove.  One call to :meth:`SecAggServer.aggregate` (server) and
:meth:`SecAggClient.submit` (each client) is one protocol instance with fresh
keys and seeds; ``round`` names the instance and must increase from call to
call on one object.

This module is the protocol's overview and its public face; the parts live in

=========================  ====================================================
:mod:`.secagg_config`      settings, t / k / t_local, the SecAgg+ graph
:mod:`.secagg_quantizer`   clipping, weighting, fixed-point encoding, error bounds
:mod:`.secagg_messages`    message kinds, declarations, round-tagged receiving
:mod:`.secagg_masks`       PRG masks, Shamir shares of the 32-byte secrets
:mod:`.secagg_client`      the client's four rounds, :class:`Faults` for tests
:mod:`.secagg_server`      the server's four rounds, pruning, the result
=========================  ====================================================

Rounds (Bonawitz et al., Fig. 4; every message carries ``r``, the round):

0. **Advertise keys.**  Client ``u`` makes two X25519 key pairs, ``c_u`` (to
   seal shares) and ``s_u`` (to agree pairwise mask seeds), and a 256-bit
   self-mask seed ``b_u``.  It signs ``(tag, run, r, u, c_u^PK, s_u^PK,
   H(b_u))`` with its party's Ed25519 federation key and sends it (``secagg/keys``).
   The server relays to each client the signed keys of its neighbours that
   advertised (U1; ``secagg/keylist``); clients verify every signature and
   that all public keys are distinct.
1. **Share keys.**  ``u`` splits ``b_u`` and ``s_u^SK`` into t-of-n Shamir
   shares over GF(2**61 - 1) (:mod:`fedhet.crypto.shamir`), seals the shares
   for neighbour ``v`` with AES-256-GCM under ``HKDF(X25519(c_u^SK, c_v^PK))``
   (associated data: tag, run, round, u, v) and sends the sealed shares to the
   server (``secagg/shares``), which relays each to its addressee with the set
   U2 of clients that shared (``secagg/relay``).
2. **Masked input.**  ``u`` sends (``secagg/masked``)
   ``y_u = q_u + PRG(b_u) + sum_{v in N(u) and U2, v > u} PRG(s_uv)
   - sum_{v in N(u) and U2, v < u} PRG(s_uv)  (mod 2**32 or 2**64)``,
   ``s_uv = HKDF(X25519(s_u^SK, s_v^PK))`` (256 bits), PRG = the AES-256-CTR
   :class:`~fedhet.crypto.prg.PRG` with the full 256-bit seed.  (Flower's
   SecAgg+ folds the shared secret into a 32-bit seed for numpy's Mersenne
   Twister; here the seed is the whole key and the generator a cipher.)
3. **Unmasking.**  The server names the clients whose masked input arrived
   (U3; ``secagg/unmask_request``).  Each client of U3 returns, for every
   client whose shares it holds, the share of ``b`` if that client is in U3 and
   the share of ``s^SK`` if it dropped after sharing (U2 minus U3), never both
   (``secagg/unmask``).  The server reconstructs, checks each ``b_u`` against
   its signed hash and each ``s_v^SK`` against ``s_v^PK``, and subtracts
   ``PRG(b_u)`` for u in U3 and the dropped clients' pairwise masks.

Identity keys and trust.  A client signs its advertisement with its party's
federation signing key: the Ed25519 key whose public half, its ``sign_key``, the
federation file pins on every machine and which also signs its transcript
(:mod:`fedhet.parties.identity`; Bonawitz et al. assume such a PKI for the
active-adversary variant).  The server checks every signature on receipt
(a client whose signature fails is dropped and named in
:attr:`SecAggResult.rejected`) and relays the signed keys; each client checks
its neighbours' against their pinned keys, so a server that swaps or alters a
client's keys is caught and named (it checked them, so a relayed signature that
fails is its own).  Every message therefore goes between a client and the
server only, as in the paper: a client of a 1,000-client federation holds one
link.  The threat model otherwise is theirs: an honest-but-curious server,
possibly colluding with fewer than t clients.

Graphs (``graph``).  ``"complete"``: every client masks with and shares among
all clients, threshold t of n.  ``"harary"`` (SecAgg+): each client masks with
and shares among its k nearest neighbours on a ring placed by a permutation
derived from the run seed, tag and round, with a local threshold t_local; the
default k and t_local tolerate the same n - t dropouts as the complete graph
(except with probability 2**-20) and a coalition of 10% of the clients (except
with probability 2**-40): see :mod:`fedhet.protocols.secagg_config`.

Dropouts.  The server collects each step until all expected clients answered
or ``timeout`` seconds passed; the silent are dropped from then on (and told
so if they come back, with a ``dropped`` notice in place of the next message
they wait for).  The round goes on while at least ``t`` clients remain and
every needed secret still has ``t_local`` share holders; otherwise it fails
with :class:`SecAggError` and the server releases nothing (the remaining
clients get an ``abort`` notice and raise too).  A message from an earlier
round is discarded when read, so a late client cannot corrupt a later round;
messages of ONE later round (one per kind) are kept for it, and a message of
a second later round names its sender (:class:`RoundInbox`).  A client whose
message is malformed, or refused on receipt (its schema, a flood), is dropped
like a silent one and named, with the reason, in :attr:`SecAggResult.rejected`,
and stays out of every later round; a client whose own input is not finite (or
whose weight is out of range) refuses it before sending anything, so the
others go on without it.

Unmasking shares are checked, not trusted: every share of a secret must lie
on the polynomial that gives the dealer's committed seed (or its mask key's
public key).  A holder proven to have sent a wrong share (one of its own
secret, or of two or more dealers' secrets) fails the round with
:class:`~fedhet.parties.api.PeerFault` naming it; when the data cannot tell
(exactly t shares, two wrong ones, or one dealer who may have dealt the
wrong share), the round fails saying it cannot name a sender, with the
evidence.  Either way no sum is released (:func:`secagg_server.check_shares`).

Quantisation and the error bound.  A client clips its vector to
``[-clip, clip]``, multiplies it by its weight ``w`` (``0 < w <= max_weight``)
and encodes it in fixed point with ``f`` fractional bits chosen so no sum can
wrap; ``w`` travels as one extra coordinate, so the server learns only
``sum w``.  The clipping bound is public and the same for plain aggregation
(:mod:`fedhet.protocols.aggregation`).  The bounds on the error of the sum and
the mean (:mod:`fedhet.protocols.secagg_quantizer`) come back with the result.
The server cannot check what a client with modified code puts under its mask
(any ring vector is possible; range proofs are out of scope): clipping bounds
what an honest client's input can contribute, not a malicious one's.
"""
from __future__ import annotations

from .secagg_client import ClientRound, Faults, SecAggClient, SubmitResult
from .secagg_config import SecAggConfig, SecAggError, harary_parameters, neighbours
from .secagg_masks import apply_masks, reconstruct_secret, share_secrets
from .secagg_messages import (DECLARATIONS, DEFAULT_MAX_ELEMS, SECRET_ELEMS, STEPS, Kind, RoundInbox, check_round,
                              declarations, payload_bytes)
from .secagg_quantizer import Quantizer, check_input
from .secagg_server import SecAggResult, SecAggServer, prune

__all__ = [
    "SecAggConfig", "SecAggClient", "SecAggServer", "SecAggResult", "SubmitResult", "SecAggError", "Faults",
    "Quantizer", "check_input", "check_round", "neighbours", "harary_parameters", "prune", "apply_masks",
    "share_secrets", "reconstruct_secret", "RoundInbox", "DECLARATIONS", "declarations", "ClientRound",
    "Kind", "STEPS", "SECRET_ELEMS", "DEFAULT_MAX_ELEMS",
    "payload_bytes",
]
