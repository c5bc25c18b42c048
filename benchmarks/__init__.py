"""fedhet's benchmark scripts: run each from the repository root as ``python -m benchmarks.NAME``
(``--quick`` for a fast look); :mod:`benchmarks.harness` is what they share, and every results file
under ``benchmarks/results/`` is written through it."""
