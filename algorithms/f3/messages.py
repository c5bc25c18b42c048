"""F³'s message kinds and their payload schemas (f3.txt, Algorithm 1).

Every receipt is checked against these before a role sees it, so the roles re-check only what a schema
cannot say: values (row indices inside the shared arrays) and shapes that depend on the sender (owner
i's width d_i) or on the number of owners (the federation's, not the settings').
"""
from __future__ import annotations


from fedhet.algorithms.f3.settings import MAX_BATCH, Settings, n_rows
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import replicated_share as rsh
from fedhet.protocols import shamir_share as ss

OWNER, HOLDER, COORDINATOR = "owner", "holder", "coordinator"


class Kind:
    """Every F³ kind string (the Shamir ones as the prefixes :mod:`fedhet.protocols.shamir_share` extends)."""

    REP = "f3/rep"              # trusted fusion: an owner's representations in the clear
    LABELS = "f3/labels"        # the label owner's labels of every sample
    OP = "f3/op"                # one first-layer step on shares: forward, backward or stop; or an epoch's end
    EPOCH = "f3/epoch"          # coordinator -> owner: a global epoch ended (checkpoint step, last or not)
    EPOCH_DONE = "f3/epoch/done"  # owner -> coordinator: it has that step too
    SHARE_PREFIX = "f3"         # f3/share: an owner's Shamir shares of its representations
    PRE_PREFIX = "f3/pre"       # f3/pre/result: shares of U = Â H W_0
    GRAD_PREFIX = "f3/grad"     # f3/grad/result: shares of dC
    ADJ_PREFIX = "f3/adj"       # f3/adj/result: shares of the upper triangle of dÂ + dÂᵀ
    RSS_PREFIX = "f3/rss"       # mpc: f3/rss/share (owner -> holder), f3/rss/key and f3/rss/round (holder <-> holder)
    MPC_LOGITS = "f3/mpc/logits"  # mpc: a holder's pair of a batch's logits, to the coordinator
    MPC_GRAD = "f3/mpc/grad"      # mpc: a holder's pair of the batch-summed dC and dW_1, to the coordinator
    Y_PREFIX = "f3/y"             # shares: f3/y/share, the coordinator's replicated sharing of the one-hot labels
    SHARES_HITS = "f3/shares/hits"            # shares: a holder's pair of a batch's count of correct predictions
    SHARES_CONFUSION = "f3/shares/confusion"  # shares: a holder's pair of a split's summed confusion matrix
    SHARES_MODEL = "f3/shares/model"          # shares, open_model only: a holder's pair of the trained weights


def _op_schema(s: Settings) -> sch.Spec:
    f64_2d = sch.Arr("<f8", (None, s.hidden))
    per_sample = sch.Arr("<f8", (None, None, s.hidden))
    adjacency = sch.OneOf((sch.Arr("<f4", (None, None)), sch.Arr("<f4", (None, None, None))))
    return sch.OneOf((
        sch.Fields({"op": sch.Str(choices=("forward",)), "step": sch.Int(lo=0),
                    "rows": sch.Arr("<u4", (None,), max_elems=MAX_BATCH), "A": adjacency, "packed": sch.Bool(),
                    "C": sch.ListOf(f64_2d, max_len=100_000), "keep": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("backward",)), "step": sch.Int(lo=0), "E": per_sample,
                    "dU": sch.Optional(per_sample), "summed": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("epoch",)), "checkpoint": sch.Int(lo=2)}),
        sch.Fields({"op": sch.Str(choices=("stop",))}),
    ))


def _mpc_op_schema(s: Settings) -> sch.Spec:
    g_part = sch.OneOf((sch.Bytes(length=32), sch.Arr("<u8", (None, None), max_elems=MAX_BATCH * 4096)))
    return sch.OneOf((
        sch.Fields({"op": sch.Str(choices=("forward",)), "step": sch.Int(lo=0),
                    "rows": sch.Arr("<u4", (None,), max_elems=MAX_BATCH), "A": sch.Arr("<f4", (None, None)),
                    "C": sch.ListOf(sch.Arr("<f8", (None, s.hidden)), max_len=100_000),
                    "W1": sch.Arr("<f8", (None, s.hidden), max_elems=1 << 16), "keep": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("backward",)), "step": sch.Int(lo=0), "ga": g_part, "gb": g_part,
                    "summed": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("epoch",)), "checkpoint": sch.Int(lo=2)}),
        sch.Fields({"op": sch.Str(choices=("stop",))}),
    ))


def _shares_op_schema(s: Settings) -> sch.Spec:
    step = {"step": sch.Int(lo=0), "rows": sch.Arr("<u4", (None,), max_elems=1 << 24),
            "A": sch.Arr("<f4", (None, None))}
    return sch.OneOf((
        sch.Fields({"op": sch.Str(choices=("train",)), **step}),
        sch.Fields({"op": sch.Str(choices=("eval",)), **step}),
        sch.Fields({"op": sch.Str(choices=("epoch",)), "checkpoint": sch.Int(lo=2), "best": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("final",)), "open": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("stop",))}),
    ))


def _shares_declarations(s: Settings, total: int, width: int | None, classes: int | None) -> list[MessageDecl]:
    def pair(shape: tuple, max_elems: int) -> sch.Spec:
        return sch.Fields({"step": sch.Int(lo=0), "a": sch.Arr("<u8", shape, max_elems=max_elems),
                           "b": sch.Arr("<u8", shape, max_elems=max_elems)})
    labels = rsh.declarations(Kind.Y_PREFIX, COORDINATOR, HOLDER, (total, classes))[0]
    return [*rsh.declarations(Kind.RSS_PREFIX, OWNER, HOLDER, (total, width)), labels,
            declare(Kind.SHARES_HITS, HOLDER, COORDINATOR, "shares: a holder's pair of ONE number per training batch, "
                    "the count of its samples whose true class has the largest logit (uint64, an integer): nothing per "
                    "sample, nothing per owner", payload=pair((1,), 1), protects="derived"),
            declare(Kind.SHARES_CONFUSION, HOLDER, COORDINATOR, "shares: a holder's pair of the confusion matrix "
                    "(true x predicted class counts, 20 fractional bits) SUMMED over a whole validation or test split: "
                    "what the macro F1 needs, nothing per sample or per owner",
                    payload=pair((classes, classes), 1 << 16), protects="derived"),
            *([declare(Kind.SHARES_MODEL, HOLDER, COORDINATOR, "shares, open_model = true only: a holder's pair of "
                       "the trained weights (P, W_0, W_1 flattened, 20 fractional bits), once at the end",
                       payload=pair((None,), 1 << 26), protects="derived")] if s.open_model else []),
            declare(Kind.OP, COORDINATOR, HOLDER, "shares: one step on shares: train (the batch's rows and the public "
                    "Â float32) or eval (a split's rows), the end of a global epoch (its checkpoint step; whether its "
                    "model is the best so far), the final model (opened or not), or stop; no model value",
                    payload=_shares_op_schema(s), protects="control")]


def _mpc_declarations(s: Settings, total: int, width: int | None) -> list[MessageDecl]:
    pair = sch.Arr("<u8", (None, None), max_elems=MAX_BATCH * 4096)
    flat = sch.Arr("<u8", (None,), max_elems=1 << 26)
    return [*rsh.declarations(Kind.RSS_PREFIX, OWNER, HOLDER, (total, width)),
            declare(Kind.MPC_LOGITS, HOLDER, COORDINATOR, "mpc: a holder's pair of the logits "
                    "W_1 (1/n) 1ᵀ Â ReLU(Â H W_0) of one batch (uint64, 38 fractional bits): per sample one number "
                    "per class, a function of ALL owners' h after the non-linearity, nothing per owner",
                    # shares, but the coordinator gets all three and opens them: it learns the declared logits
                    payload=sch.Fields({"step": sch.Int(lo=0), "a": pair, "b": pair}), protects="derived"),
            declare(Kind.MPC_GRAD, HOLDER, COORDINATOR, "mpc: a holder's pair of dC = Σ_b h_bᵀ E_b[i], the first "
                    "layer's gradient, and dW_1 = Σ_b dℓ_b p_bᵀ, both SUMMED over the batch (dC per owner, or over "
                    "the owners too with align tied / none; uint64)", payload=sch.Fields({"step": sch.Int(lo=0), "a": flat, "b": flat}),
                    protects="derived"),   # opened by the coordinator, as the logits
            declare(Kind.OP, COORDINATOR, HOLDER, "mpc: one step on shares: forward (batch rows, the public Â "
                    "float32, C_i = P_iᵀW_0ᵀ and W_1) or backward (the holder's pair of a 2-of-3 sharing of dℓ = dL/dlogits "
                    "per sample times the batch size: uniform words or a seed), or stop; or the end of a global epoch",
                    # dℓ travels as shares, but Â, C_i and W_1 (model values) in the clear: the weaker of the two.
                    payload=_mpc_op_schema(s), protects="derived")]


def _epoch_declarations() -> list[MessageDecl]:
    return [declare(Kind.EPOCH, COORDINATOR, OWNER, "a global epoch ended: its checkpoint step (1 + epochs done) "
                    "and whether training stops there; no data", payload=sch.Fields({"checkpoint": sch.Int(lo=2),
                                                                                     "last": sch.Bool()}),
                    protects="control"),
            declare(Kind.EPOCH_DONE, OWNER, COORDINATOR, "the owner has reached that checkpoint step too; no data",
                    payload=sch.Fields({"checkpoint": sch.Int(lo=2)}), protects="control")]


def declarations(s: Settings) -> list[MessageDecl]:
    """The kinds the settings allow: the labels, the ends of the global epochs (so that every party checkpoints
    at them), and either the clear representations (trusted fusion), or the shares, the holders' result shares
    and the coordinator's step requests (shamir_linear), or the replicated shares, the holders' rounds, the
    logits and summed gradients, and the step requests (mpc)."""
    total = sum(n_rows(s))
    width = s.local_hidden if s.owner_hidden is None else None
    labels = declare(Kind.LABELS, OWNER, COORDINATOR, "the label owner's labels of every sample (train, validation "
                     "and test: the latter two for model selection and scoring); int64 (n_rows,)",
                     payload=sch.Fields({"y": sch.Arr("<i8", (total,))}), protects="clear")
    if s.fusion == "trusted":
        return [labels, *_epoch_declarations(),
                declare(Kind.REP, OWNER, COORDINATOR, "trusted fusion: an owner's representations h^i of "
                        "every sample IN THE CLEAR (the paper's base setting); float64 (n_rows, d_i)",
                        # The owners' local representations (declared latent values, not raw rows).
                        payload=sch.Fields({"h": sch.Arr("<f8", (total, width))}), protects="derived")]
    if s.fusion == "mpc":
        return [labels, *_epoch_declarations(), *_mpc_declarations(s, total, width)]
    if s.fusion == "shares":
        classes = None if s.dataset == "vowels" else 2   # vowels: 9 or more (the labels say)
        return [labels, *_epoch_declarations(), *_shares_declarations(s, total, width, classes)]
    share_decl, _ = ss.declarations(Kind.SHARE_PREFIX, OWNER, HOLDER, COORDINATOR,
                                    share_shape=(total, width))
    results = [ss.declarations(prefix, OWNER, HOLDER, COORDINATOR, result_shape=shape)[1]
               for prefix, shape in ((Kind.PRE_PREFIX, (None, None, s.hidden)), (Kind.GRAD_PREFIX, (None,)),
                                     (Kind.ADJ_PREFIX, (None, None)))]
    return [labels, *_epoch_declarations(), share_decl, *results,
            declare(Kind.OP, COORDINATOR, HOLDER, "one step of the first layer on shares: forward (batch rows, "
                    "public Â float32, a graph per sample as its upper triangle, and C_i = P_iᵀW_0ᵀ) or backward (public "
                    "E = Âᵀδ and, to t holders only, δ, both scaled by the batch size), or stop; or the end of a "
                    "global epoch (its checkpoint step, no data)",
                    # backward sends E = Âᵀδ and δ per sample in plaintext: values in the clear.
                    payload=_op_schema(s), protects="clear")]
