"""``fedhet predict``'s run-folder side: a training federation turned into its prediction job.

The job itself (its settings, layouts, roles and files) is the algorithm's
(:mod:`fedhet.algorithms.predict`); here the operations layer points it at a trained run folder and
at the folder its predictions go to.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from fedhet.parties import runfolder as rf
from fedhet.parties.contract import PREDICT_SUFFIX
from fedhet.parties.federation import Federation

FOLDER_KEYS = ("trained_run", "predictions_out")   # JobKeys that fedhet predict sets itself


def job_federation(fed: Federation, trained_run: str | Path, out: str | Path) -> Federation:
    """``fed`` (the training federation, its parties' data now their new rows; or a prediction job's
    federation file, whose run folders are replaced) as its prediction job."""
    if not (Path(trained_run) / rf.PARTIES).is_dir():
        raise ValueError(f"--model {trained_run}: not a run folder (no parties/ in it)")
    again = fed.algorithm_name.endswith(PREDICT_SUFFIX)
    name = fed.algorithm_name[:-len(PREDICT_SUFFIX)] if again else fed.algorithm_name
    # the folders are fedhet predict's to set; the job's other keys (its PSI's backend and workers) a job's
    # own federation file may set, and they carry over
    table = {k: v for k, v in fed.algorithm.items() if k != "name" and not (again and k in FOLDER_KEYS)}
    clash = [k for k in FOLDER_KEYS if k in table]
    if clash:
        raise ValueError(f"{fed.source}: [algorithm] sets {clash}: fedhet predict sets these itself")
    algo = {"name": name + PREDICT_SUFFIX, **table,
            "trained_run": str(Path(trained_run).resolve()), "predictions_out": str(Path(out).resolve())}
    return dataclasses.replace(fed, algorithm=algo)
