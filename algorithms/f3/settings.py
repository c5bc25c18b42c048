"""F³'s settings (the ``[algorithm]`` table) and the sizes every party derives from them alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedhet.algorithms.f3.traffic import SIZES
from fedhet.algorithms.toolkit import Stream
from fedhet.parties.settings import setting

NAME = "f3"
VOWELS_ROWS = (270, 370)          # the .ts files' TRAIN / TEST sizes
MAX_BATCH = 4096


@dataclass(frozen=True)
class Settings:
    dataset: Literal["vowels", "metr_la", "pems_bay", "grid"] = setting(
        "vowels", "vowels: Japanese Vowels (real, 12 owners); metr_la / pems_bay: incident windows SIMULATED on "
                  "the real road graph (one sensor per owner); grid: SIMULATED on a generated 4 x 4 street grid "
                  "(no data folder)")
    n_sensors: int | None = setting(None, "traffic: keep the first n sensors and their subgraph (None: all)", lo=2)
    n_windows: int | None = setting(None, "traffic: simulated windows (None: the paper's 2,856 / 4,343)", lo=10)
    data_seed: int = setting(0, "traffic: seed of the simulator", lo=0)
    speeds_file: str | None = setting(None, "traffic: the REAL speeds (DCRNN's metr-la.h5 / pems-bay.h5) instead "
                                            "of the simulator; needs labels_file")
    labels_file: str | None = setting(None, "traffic: one 0/1 label per 12-step window of speeds_file "
                                            "(.npy or text)")
    split_seed: int = setting(123, "seed of the train/validation split (traffic: the reference 70/10/20)", lo=0)
    val_fraction: float = setting(0.2, "vowels: part of the TRAIN file held out for validation", lo=0, hi=1,
                                  lo_open=True)
    fusion: Literal["shares", "mpc", "shamir_linear", "trusted", "shamir"] = setting(
        "shamir_linear", "shares: the model trained on 2-of-3 replicated shares end to end (the owners' h, the labels "
                         "the coordinator shares, every weight and the SGD-with-momentum update; algorithms/f3/shares.py): "
                         "the coordinator opens per batch only the number of correct predictions, per evaluation a "
                         "confusion matrix summed over the split, and the model only if open_model; named for what "
                         "stays on shares (everything), beside mpc, which opens per-sample logits and per-owner "
                         "gradients; mpc: representations secret-shared (2-of-3 replicated) to three holders, which compute the "
                         "first layer, ReLU and pooling on shares; the coordinator receives only pooled vectors and "
                         "batch-summed gradients; shamir_linear: Shamir-shared to the holders, which compute the "
                         "linear first layer only: the coordinator reconstructs it and RECOVERS the representations; "
                         "trusted: sent in the clear to the coordinator (the paper's base setting)")
    t: int = setting(2, "Shamir threshold: any t holders reconstruct, t - 1 learn nothing", lo=1)
    ask: Literal["t", "all"] = setting(
        "t", "holders asked for each training and inference step: 't' (t of the m, rotating from step to step, "
        "the others idle) or 'all' (every share beyond the first t is checked to lie on the same polynomial, "
        "which detects a holder sending a wrong share, at (m - t) / t more holder work)")
    local_hidden: int = setting(16, "width d_i of every owner's LSTM (unless owner_hidden)", lo=1)
    owner_hidden: list[int] | None = setting(None, "per-owner widths d_i in federation order (rectangular P_i)")
    local_epochs: int = setting(200, "local pre-training epochs at most", lo=1)
    local_patience: int = setting(20, "local early stopping (epochs without a better validation loss)", lo=1)
    local_lr: float = setting(1e-3, "local Adam learning rate", lo=0, lo_open=True)
    local_batch: int = setting(100, "local mini-batch", lo=1)
    d: int = setting(16, "width of the aligned representations P_i h^i", lo=1)
    hidden: int = setting(16, "width of W_0's output", lo=1)
    align: Literal["none", "soft", "hard", "tied"] = setting("soft", "alignment P_i (none needs d_i = d)")
    graph: Literal["none", "given", "icdf"] = setting("icdf", "consensus graph: none (Â = I), given (the road "
                                                              "graph, binarised), icdf (Eq. (9), learned)")
    tau: float = setting(0.1, "ICDF temperature", lo=0, lo_open=True)
    test_samples: int = setting(10, "ICDF graphs averaged at evaluation", lo=1)
    epochs: int = setting(100, "global epochs at most", lo=1)
    patience: int = setting(20, "global early stopping (epochs)", lo=1)
    lr: float = setting(1e-2, "global Adam learning rate", lo=0, lo_open=True)
    batch: int = setting(100, "global mini-batch", lo=1, hi=MAX_BATCH)
    frac_bits: int = setting(16, "fixed-point fractional bits of the shared representations", lo=1, hi=30)
    public_frac_bits: int = setting(14, "fractional bits of the public operands C_i and Â", lo=1, hi=30)
    grad_frac_bits: int = setting(18, "fractional bits of the public backward operands (batch x δ, E)", lo=1,
                                  hi=30)
    optimizer: Literal["sgd", "lion"] = setting(
        "lion", "fusion shares: the optimiser on shares: SGD with momentum (sgd_lr, momentum) or Lion (lion_lr; "
               "betas 0.9 / 0.99: the update is lr times a sign, one comparison on shares, and per-coordinate "
               "normalised like Adam, whose reciprocal square root of a value of unknown range is not offered)")
    lion_lr: float = setting(1e-2, "fusion shares: Lion's learning rate", lo=0, lo_open=True)
    sgd_lr: float = setting(0.5, "fusion shares, optimizer sgd: the learning rate (of the batch-mean loss; 0.5 matched Adam at lr 1e-2 on "
                                    "f3_grid, but oscillated on Japanese Vowels: benchmarks/f3_shares.py)", lo=0, lo_open=True)
    momentum: float = setting(0.9, "fusion shares: SGD momentum", lo=0, hi=0.999)
    open_model: bool = setting(False, "fusion shares: open the trained weights to the coordinator at the end (false: "
                                      "the model stays shared among the holders, each saving its shares as its part, fedhet predict "
                                      "runs on them, and the coordinator saves no part)")
    init_seed: int | None = setting(None, "fusion shares: None draws each holder's term of the initial weights from "
                                          "the OS (no party knows them); an integer seeds every holder's term from it "
                                          "(reproducible runs and tests: whoever knows it knows the initial weights)",
                                    lo=0)
    seed: int = setting(0, "seeds the local models (seed + owner index) and the global model", lo=0)
    torch_threads: int = setting(1, "torch.set_num_threads (and numpy's BLAS threads) in every role (1: results do not depend on how the "
                                    "parties share a process; 0: leave torch's default)", lo=0)

    def validate(self) -> None:
        if self.fusion == "shamir":
            raise ValueError("f3: fusion 'shamir' is now called 'shamir_linear' (the holders compute the linear "
                             "first layer and the coordinator reconstructs it, which reveals the representations to "
                             "the coordinator); 'mpc' also computes ReLU and pooling on shares and hides them")
        if self.fusion == "shares" and self.align not in ("soft", "none"):
            raise ValueError(f"f3: fusion 'shares' trains align 'soft' or 'none' on shares, got align {self.align!r}")
        if self.fusion == "shares" and self.owner_hidden is not None and len(set(self.owner_hidden)) > 1:
            raise ValueError("f3: fusion 'shares' needs every owner's width d_i equal (owner_hidden differs)")
        if self.fusion in ("mpc", "shares") and self.graph not in ("given", "none"):
            raise ValueError(f"f3: fusion {self.fusion!r} needs a public fixed graph (graph 'given' or 'none'), got "
                             f"graph {self.graph!r}: the learned graph's gradient is not computed on shares")
        if self.fusion in ("mpc", "shares") and self.t != 2:
            raise ValueError(f"f3: fusion {self.fusion!r} is 2-of-3 replicated sharing among exactly three holders: "
                             f"t must be 2, got {self.t}")
        if (self.speeds_file is None) != (self.labels_file is None):
            raise ValueError("f3: speeds_file and labels_file go together (real speeds need the user's labels)")
        if self.speeds_file is not None and self.dataset not in ("metr_la", "pems_bay"):
            raise ValueError("f3: speeds_file / labels_file are for the real road graphs (metr_la, pems_bay)")
        if self.graph == "given" and self.dataset == "vowels":
            raise ValueError("f3: graph 'given' needs a traffic data set (Japanese Vowels has no given graph)")


def n_rows(s: Settings) -> tuple[int, int, int]:
    """(train, validation, test) sample counts; every owner's representation array is their concatenation."""
    if s.dataset == "vowels":
        n_val = int(round(s.val_fraction * VOWELS_ROWS[0]))
        return VOWELS_ROWS[0] - n_val, n_val, VOWELS_ROWS[1]
    w = s.n_windows or SIZES[s.dataset][0]
    a, b = int(round(0.7 * w)), int(round(0.8 * w))
    return a, b - a, w - b


def owner_widths(s: Settings, n: int) -> list[int]:
    if s.owner_hidden is None:
        return [s.local_hidden] * n
    if len(s.owner_hidden) != n:
        raise ValueError(f"f3: owner_hidden lists {len(s.owner_hidden)} widths for {n} owners")
    return [int(w) for w in s.owner_hidden]


def owner_seed(seed: int, index: int) -> int:
    """The seed of owner ``index``'s local model (Algorithm 1, lines 1-4) in a run seeded with ``seed``:
    ``seed * F3_OWNER_STRIDE + index``."""
    return seed * int(Stream.F3_OWNER_STRIDE) + index
