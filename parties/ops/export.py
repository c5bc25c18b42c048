"""``fedhet export RUN``: each party's trained part in the formats a deployment reads.

For every party of a finished run whose role saved a trained part (``<party>/model/``, see
:mod:`fedhet.parties.model_store`), ``export_run`` writes ``OUT/<party>/``:

- ``weights.safetensors``: the part's tensors, as the run wrote them;
- ``metadata.json``: the algorithm, the party and its role, the settings, the feature names and
  their order, the scaler, the classes, the inputs and outputs of the scoring module, the
  fedhet version, the run id and the federation's fingerprint (everything the part's
  ``meta`` holds, and ``check``: a few input rows with the outputs the trained part gave them);
- ``model.onnx``: where the algorithm's scoring module is a plain torch network (ONNX opset 17,
  batch dimension dynamic).

Each part is rebuilt and proven to score as the trained one did first
(:func:`fedhet.algorithms.scoring.rebuild`).  :func:`load_export` reads such a folder back into the
algorithm's own scoring module (the algorithm's ``load_model``).
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from fedhet.algorithms.scoring import ExportError, inputs, rebuild
from fedhet.parties import runfolder as rf
from fedhet.parties.atomic import write_json_atomic
from fedhet.parties.contract import Algorithm
from fedhet.parties.model_store import TENSORS, ModelFileError, TrainedPart, read_part

WEIGHTS, METADATA, ONNX = "weights.safetensors", "metadata.json", "model.onnx"
OPSET = 17


def _onnx(module: torch.nn.Module, meta: Mapping[str, Any], path: Path) -> None:
    specs = meta.get("inputs") or []
    example = inputs(meta, meta["check"]["inputs"]) if meta.get("check") else [
        torch.zeros([1 if d is None else int(d) for d in s["shape"]],
                    dtype=torch.float64 if s.get("dtype") == "float64" else torch.float32) for s in specs]
    names = [s["name"] for s in specs]
    outputs = list(meta.get("outputs") or ["output"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter announces its successor
        torch.onnx.export(module.eval(), tuple(example), str(path), dynamo=False, opset_version=OPSET,
                          input_names=names, output_names=outputs,
                          dynamic_axes={n: {0: "rows"} for n in names + outputs})


def export_run(run_dir: str | Path, out_dir: str | Path, get_algorithm: Callable[[str], Algorithm],
               party: str | None = None, onnx: bool = True) -> dict[str, Path]:
    """Export every party's trained part of ``run_dir`` (or ``party``'s) into ``out_dir``; party ->
    its export folder.  Each part is first rebuilt and checked against the outputs it recorded."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    parties_dir = run_dir / rf.PARTIES
    if not parties_dir.is_dir():
        raise ExportError(f"{run_dir}: not a run folder (no parties/ in it)")
    names = sorted(p.name for p in parties_dir.iterdir() if p.is_dir())
    if party is not None:
        if party not in names:
            raise ExportError(f"{run_dir}: no party {party!r} (parties: {', '.join(names)})")
        names = [party]
    done: dict[str, Path] = {}
    for name in names:
        folder = parties_dir / name / rf.MODEL
        if not folder.is_dir():
            if party is not None:
                raise ExportError(f"{run_dir}: party {name!r} saved no trained part (no {folder})")
            continue
        part = read_part(folder)
        module = rebuild(get_algorithm(str(part.header.get("algorithm"))), part, folder)
        dest = out_dir / name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / TENSORS, dest / WEIGHTS)
        write_json_atomic(dest / METADATA, metadata(part))
        if onnx and isinstance(module, torch.nn.Module) and part.meta.get("inputs"):
            _onnx(module, part.meta, dest / ONNX)
        done[name] = dest
    if not done:
        raise ExportError(f"{run_dir}: no party saved a trained part (this algorithm trains none, or the run "
                          f"did not finish)")
    return done


def metadata(part: TrainedPart) -> dict[str, Any]:
    """The export's metadata: the runtime's header (algorithm, party, role, settings, version, run,
    fingerprint) and the algorithm's meta (feature names, scaler, classes, inputs, outputs, check)."""
    return {**part.header, "weights": WEIGHTS, "meta": part.meta}


def load_export(folder: str | Path, get_algorithm: Callable[[str], Algorithm]) -> tuple[Any, dict[str, Any]]:
    """The scoring module of an export folder and its metadata."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    try:
        doc = json.loads((folder / METADATA).read_text())
        tensors = load_file(str(folder / WEIGHTS))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{folder}: not an export folder ({METADATA} and {WEIGHTS}): {e}") from None
    algo = get_algorithm(str(doc.get("algorithm")))
    if algo.load_model is None:
        raise ExportError(f"{folder}: algorithm {algo.name!r} has no loader for its trained parts")
    return algo.load_model(doc.get("meta") or {}, tensors), doc
