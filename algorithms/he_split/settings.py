"""The HE split network's ``[algorithm]`` keys: one typed settings class, parsed by ``parse_settings``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedhet.algorithms.toolkit import ACTIVATIONS, PSIBackend, psi_backend_setting
from fedhet.parties.settings import setting
from fedhet.protocols.dp_settings import ReleaseDPSettings
from fedhet.protocols.he_interactive import LayerSpec

NAME = "he_split"
ALIASES = {"breast_sklearn": "breast_sk"}
MAX_ROWS_PLANNED = 1 << 20  # training rows the default he_max_steps covers per epoch

_SPEC = LayerSpec()  # the layer's own defaults


def default_max_steps(epochs: int, batch_size: int, max_batches: int | None = None) -> int:
    """Training batches the auto slot width is sized for unless ``he_max_steps`` says: ``max_batches`` when
    set, else ``epochs * ceil(2**20 / batch_size)`` (from the public settings alone, as the declarations need)."""
    if max_batches is not None:
        return int(max_batches)
    return int(epochs) * -(-MAX_ROWS_PLANNED // int(batch_size))


@dataclass(frozen=True)
class Settings:
    """The ``[algorithm]`` keys of ``he_split``."""

    dataset: Literal["breast_sk", "breast_sklearn", "cancer", "payment", "credit", "vehicle"] = setting(
        "breast_sk", "breast_sk (scikit-learn; alias breast_sklearn), cancer, payment, credit, vehicle")
    selftaught_frac: float = setting(0.4, "share of rows dropped from the host (as STFL's self-taught rows)",
                                     lo=0, hi=0.95)
    test_frac: float = setting(0.2, "share of the host's rows held out for testing", lo=0, lo_open=True, hi=0.9)
    epochs: int = setting(100, "training epochs", lo=1)
    max_batches: int | None = setting(None, "stop after this many batches in all (timing runs)", lo=1)
    batch_size: int = setting(128, "mini-batch size", lo=1)
    lr: float = setting(0.01, "learning rate of the bottom and top models", lo=0, lo_open=True)
    interactive_lr: float = setting(0.3, "learning rate of the interactive layer", lo=0, lo_open=True)
    host_bottom_width: int = setting(8, "output width of the host's bottom model", lo=1)
    guest_bottom_width: int = setting(8, "output width of each guest's bottom model", lo=1)
    bottom_layers: int = setting(0, "hidden layers of the bottom models", lo=0)
    bottom_hidden_mult: float = setting(2.0, "bottom hidden width multiplier", lo=0, lo_open=True)
    bottom_activation: str = setting("relu", "bottom activation", choices=tuple(sorted(ACTIVATIONS)))
    interactive_width: int = setting(8, "output width of the interactive layer", lo=1)
    interactive_activation: str = setting("relu", "activation after the interactive layer",
                                          choices=tuple(sorted(ACTIVATIONS)))
    top_layers: int = setting(0, "hidden layers of the host's top model", lo=0)
    top_hidden_mult: float = setting(2.0, "top hidden width multiplier", lo=0, lo_open=True)
    he: Literal["paillier", "naive", "ckks"] = setting("paillier", "packed Paillier, one value per phe "
                                                      "ciphertext (naive), or CKKS")
    key_bits: int = setting(2048, "Paillier modulus bits", lo=512)
    slot_bits: int | Literal["auto"] = setting("auto", "bits per packed Paillier slot, or auto: "
                                               "sized from the other settings for he_max_steps batches", lo=8)
    he_max_steps: int | None = setting(None, "training batches an auto slot width is sized for (default: "
                                       "max_batches, else epochs * ceil(2**20 / batch_size))", lo=1)
    mask_bits: int = setting(_SPEC.mask_bits, "statistical masking bits", lo=0)
    a_int_bits: int = setting(_SPEC.a_int_bits, "integer bits of activations", lo=0)
    a_frac_bits: int = setting(_SPEC.a_frac_bits, "fraction bits of activations", lo=0)
    w_frac_bits: int = setting(_SPEC.w_frac_bits, "fraction bits of the interactive weights", lo=0)
    d_int_bits: int = setting(_SPEC.d_int_bits, "integer bits of the gradients", lo=0)
    d_frac_bits: int = setting(_SPEC.d_frac_bits, "fraction bits of the gradients", lo=0)
    ckks_mask: float = setting(_SPEC.ckks_mask, "CKKS noise mask amplitude", lo=0, lo_open=True)
    pool: bool = setting(True, "precompute Paillier obfuscators in a pool")
    he_workers: int = setting(1, "worker processes for the HE arithmetic", lo=1)
    obfuscation: Literal["short_exponent", "standard"] = setting(
        _SPEC.obfuscation, "Paillier obfuscators: DJN short exponent h**x (fast) or standard r**n")
    torch_threads: int = setting(1, "torch.set_num_threads per party", lo=0)
    psi_timeout: float | None = setting(None, "seconds to wait for any one PSI message", lo=0, lo_open=True)
    psi_backend: PSIBackend = psi_backend_setting()
    # DP on each guest's bottom-model output (protocols/dp_settings.RowReleases): every row clipped and
    # noised each time it is released, at most dp_passes times; the epsilon is per row over the run
    release: ReleaseDPSettings = setting(ReleaseDPSettings(), flatten=True)
    evaluate: bool = setting(True, "evaluate on the test rows after training (false: test_accuracy is None)")
    return_params: bool = setting(False, "return the trained parameters (tests)")
    seed: int = setting(0, "seeds the split, the models, the batches", lo=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dataset", ALIASES.get(self.dataset, self.dataset))

    def validate(self) -> None:
        _ = self.layer  # LayerSpec checks the layer's settings together (a ValueError naming them)

    @property
    def max_steps(self) -> int:
        """Training batches the HE layer's auto slot width is sized for (``he_max_steps`` or its default)."""
        if self.he_max_steps is not None:
            return self.he_max_steps
        return default_max_steps(self.epochs, self.batch_size, self.max_batches)

    @property
    def dp_passes(self) -> int:
        """The most times a guest releases one row's activation: once per epoch, and once more for the
        test pass (the guest cannot tell training rows from test rows, so it plans for both)."""
        return self.epochs + int(self.evaluate)

    def planned_steps(self, n_train: int) -> int:
        """Training batches this run takes with ``n_train`` training rows."""
        steps = self.epochs * -(-int(n_train) // self.batch_size)
        return steps if self.max_batches is None else min(steps, self.max_batches)

    @property
    def layer(self) -> LayerSpec:
        """The interactive layer's settings, as both parties build them."""
        return LayerSpec(
            scheme=self.he, key_bits=self.key_bits, slot_bits=self.slot_bits, max_steps=self.max_steps,
            a_int_bits=self.a_int_bits, a_frac_bits=self.a_frac_bits, w_frac_bits=self.w_frac_bits,
            d_int_bits=self.d_int_bits, d_frac_bits=self.d_frac_bits, mask_bits=self.mask_bits,
            lr=self.interactive_lr, batch_size=self.batch_size, ckks_mask=self.ckks_mask, pool=self.pool,
            workers=self.he_workers, obfuscation=self.obfuscation)
