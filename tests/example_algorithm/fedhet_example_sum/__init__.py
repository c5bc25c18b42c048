"""example_sum: the smallest complete algorithm, outside fedhet, to show what adding one takes.

Every ``adder`` sends one number to the ``summer``, which adds them up.  The package is all
there is to it, with one entry point (``example_sum = fedhet_example_sum`` in the
``fedhet_algorithms`` group) and its smallest run, ``smoke.toml``, beside this file.
"""
from __future__ import annotations

from fedhet.parties.contract import Algorithm

from .data import load_data
from .messages import declarations
from .roles import adder, summer
from .settings import Settings

ALGORITHM = Algorithm(name="example_sum", summary="every adder sends one number; the summer adds them up",
                      roles={"adder": adder, "summer": summer}, load_data=load_data,
                      declarations=declarations, settings=Settings, headline=("total",))
