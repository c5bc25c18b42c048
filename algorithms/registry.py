"""The runnable algorithms: those registered in the ``fedhet_algorithms`` entry-point group.

fedhet's own algorithms are listed in that group by ``pyproject.toml``; a package of a user's
adds its own the same way (one entry point naming its module, which exposes ``ALGORITHM``, a
:class:`fedhet.parties.contract.Algorithm`).  The CLI hands :func:`get_algorithm` to the
runtime and the audit; ``parties/`` itself imports no algorithm.
"""
from __future__ import annotations

from fedhet.parties.contract import Algorithm, installed_algorithm, installed_entry_points


def names() -> list[str]:
    return sorted(installed_entry_points())


def get_algorithm(name: str) -> Algorithm:
    return installed_algorithm(name)
