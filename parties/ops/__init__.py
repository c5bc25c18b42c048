"""fedhet's operations layer: what a user runs around the party runtime.

=================  ==========================================================================
module             what
=================  ==========================================================================
``cli``            the ``fedhet`` command (``party`` and ``host`` come from
                   :mod:`fedhet.parties.entry`, the runtime's own entry point)
``launcher``       ``fedhet run``: a run folder, an engine, progress, the verdict, the summary
``engines``        what a run runs on: :class:`~fedhet.parties.ops.engines.Engine`;
                   ``engines.local`` (processes of this machine), ``engines.ray`` (a Ray cluster)
``runview``        a run folder read for people: status, curves, message map
``report``         ``fedhet report``: one self-contained HTML page (``templates/``)
``board``          ``fedhet board``: the runs live on a local web page
``export``         ``fedhet export``: trained parts as safetensors and ONNX
``predict``        ``fedhet predict``'s run-folder side (the job is the algorithm's)
``demo``           ``fedhet demo``: the headline job end to end
``presets``        the federation files that ship with fedhet
=================  ==========================================================================

The layering (house rule ``ops-layer``, ``tests/house_rules.py``): nothing outside this package
imports it; the runtime (the rest of ``fedhet.parties``), ``protocols`` and ``crypto`` import no
algorithm either.  A party process starts in :mod:`fedhet.parties.entry` and never imports this
package, so a machine that only runs parties needs none of the report's web stack.
"""
