"""A trained part's scoring module and the proof that a rebuilt one scores as the trained one did.

A party's trained part (:mod:`fedhet.parties.model_store`) records a few input rows with the outputs
it gave them (``meta["check"]``).  :func:`rebuild` turns a part back into the algorithm's scoring
module (its ``load_model``) and :func:`check_part` shows that module gives exactly those outputs: a
round trip is identical, not approximately so.  :func:`score` runs a module on named input rows.
``fedhet predict`` (:mod:`fedhet.algorithms.predict`) and ``fedhet export``
(:mod:`fedhet.parties.ops.export`) both stand on these.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from fedhet.parties.contract import Algorithm
from fedhet.parties.model_store import TrainedPart


class ExportError(ValueError):
    """A run, a part or an export folder that cannot be rebuilt, exported or loaded; the text says which and why."""


def inputs(meta: Mapping[str, Any], rows: Mapping[str, Any]) -> list[torch.Tensor]:
    out = []
    for spec in meta.get("inputs") or []:
        dtype = torch.float64 if spec.get("dtype") == "float64" else torch.float32
        out.append(torch.as_tensor(np.asarray(rows[spec["name"]]), dtype=dtype))
    return out


def score(module: Any, meta: Mapping[str, Any], rows: Mapping[str, Any]) -> np.ndarray:
    """The scoring module's outputs for ``rows`` (input name -> array, the meta's ``inputs``)."""
    with torch.no_grad():
        return module(*inputs(meta, rows)).detach().cpu().numpy()


def check_part(module: Any, meta: Mapping[str, Any]) -> str | None:
    """None when ``module`` gives exactly the outputs the trained part recorded in ``meta["check"]``
    (a part without a check passes); else what differs."""
    check = meta.get("check")
    if not check:
        return None
    got = score(module, meta, check["inputs"])
    want = np.asarray(check["outputs"], dtype=got.dtype)
    if got.shape != want.shape:
        return f"outputs of shape {list(got.shape)}, the trained part gave {list(want.shape)}"
    if not np.array_equal(got, want):
        return f"outputs differ from the trained part's by up to {float(np.max(np.abs(got - want))):.3g}"
    return None


def rebuild(algo: Algorithm, part: TrainedPart, where: str | Path) -> Any:
    """``part``'s scoring module, rebuilt by ``algo.load_model`` and checked to score its check rows as the
    trained part did; an :class:`ExportError` naming ``where`` otherwise."""
    if algo.load_model is None:
        raise ExportError(f"{where}: algorithm {algo.name!r} has no loader for its trained parts")
    try:
        module = algo.load_model(part.meta, part.tensors)
    except (ValueError, KeyError, TypeError, IndexError) as e:   # a malformed part: say which file
        raise ExportError(f"{where}: {algo.name!r} cannot rebuild this part: {type(e).__name__}: {e}") from None
    problem = check_part(module, part.meta)
    if problem:
        raise ExportError(f"{where}: the rebuilt part does not score as the trained one: {problem}")
    return module
