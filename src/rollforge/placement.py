"""Where an episode was served on a Ray cluster: the environment actor that held its session and
the generation replica that returned its last completion, each with the node it runs on.

``Placement`` names one actor (``name``: an environment actor as ``<pool>/<slot>``, such as
``guess_number/1``; a generation replica by its name, such as ``hf replica 0``), the id of the Ray
node it runs on (hex, as ``ray.nodes()`` gives ``NodeID``) and that node's IP address (``host``).
An actor says where it runs once, when it starts (its ``ready()`` answers ``this_node`` of
``cluster/connect.py``); the driver adds the name. ``ServedBy`` is what an episode records
(``Trajectory.served_by``): either part is None when that side ran in the driver's process (a
local environment, a local backend), so an episode that ran wholly here has an empty one.

JSON (a ``trajectories.jsonl`` record; absent when empty, each part only when known)::

    "served_by": {"environment": {"name": "guess_number/1", "node": "<node id>", "host": "10.0.0.7"},
                  "generation": {"name": "hf replica 0", "node": "<node id>", "host": "10.0.0.8"}}

Nothing here imports rollforge, so the lowest floor can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: The sides of an episode that may run on Ray actors, in ``ServedBy``'s order.
SIDES = ("environment", "generation")


@dataclass(frozen=True)
class Placement:
    """One Ray actor: its name, its node's id and its node's IP address."""

    name: str
    node: str
    host: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "node": self.node, "host": self.host}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Placement:
        return cls(str(record["name"]), str(record["node"]), str(record["host"]))


@dataclass(frozen=True)
class ServedBy:
    """Where one episode was served (see the module docstring); false when it ran wholly here."""

    environment: Placement | None = None
    generation: Placement | None = None

    def __bool__(self) -> bool:
        return self.environment is not None or self.generation is not None

    def parts(self) -> dict[str, Placement]:
        """The known placements by side (``environment``, ``generation``)."""
        placed = zip(SIDES, (self.environment, self.generation))
        return {side: placement for side, placement in placed if placement is not None}

    def to_json(self) -> dict[str, dict[str, str]]:
        return {side: placement.to_json() for side, placement in self.parts().items()}

    @classmethod
    def from_json(cls, record: Mapping[str, Any] | None) -> ServedBy:
        """Read back ``to_json``; None or ``{}`` (a record written before, or of a local episode)
        is the empty one."""
        record = record or {}
        return cls(*(Placement.from_json(record[side]) if record.get(side) else None for side in SIDES))


#: An episode that ran wholly in this process.
HERE = ServedBy()
