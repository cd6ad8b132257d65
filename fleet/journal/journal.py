"""The journal: its file, claims and attempts, and costs, each a part in a module of its own (the contract:
:mod:`fleet.journal`)."""

from __future__ import annotations



from fleet.journal.claims import _Claims
from fleet.journal.costs import _Costs


class Journal(_Claims, _Costs):
    """The journal file at ``path`` (see the module docstring). ``now``: the clock every timestamp the
journal writes or reads against comes from (wall time; the fleet simulator passes its simulated clock)."""
