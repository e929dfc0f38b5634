"""Where an episode was served (``placement.py``): ``Trajectory.served_by`` through the
``trajectories.jsonl`` record and back, absent from the record of an episode that ran here, and
records written before it existed read back as served here."""

import json

from rollforge.completion import Completion
from rollforge.placement import HERE, Placement, ServedBy
from rollforge.types import Trajectory

from test_types_outcome import make

ACTOR = Placement("guess_number/1", "a1" * 28, "10.0.0.7")
REPLICA = Placement("hf replica 0", "b2" * 28, "10.0.0.8")


def through_the_file(trajectory: Trajectory) -> tuple[dict, Trajectory]:
    line = json.dumps(trajectory.to_json())
    return json.loads(line), Trajectory.from_json(line)


def test_both_sides_round_trip_through_the_record():
    record, back = through_the_file(make(served_by=ServedBy(ACTOR, REPLICA)))
    assert record["served_by"] == {
        "environment": {"name": "guess_number/1", "node": "a1" * 28, "host": "10.0.0.7"},
        "generation": {"name": "hf replica 0", "node": "b2" * 28, "host": "10.0.0.8"},
    }
    assert back.served_by == ServedBy(ACTOR, REPLICA) and back == make(served_by=ServedBy(ACTOR, REPLICA))


def test_one_side_on_ray_writes_only_that_side():
    record, back = through_the_file(make(served_by=ServedBy(environment=ACTOR)))
    assert record["served_by"] == {"environment": ACTOR.to_json()}
    assert back.served_by == ServedBy(ACTOR, None) and back.served_by.parts() == {"environment": ACTOR}
    record, back = through_the_file(make(served_by=ServedBy(generation=REPLICA)))
    assert record["served_by"] == {"generation": REPLICA.to_json()} and back.served_by.generation == REPLICA


def test_an_episode_served_here_has_no_served_by_and_old_records_read_back_as_here():
    assert not HERE and HERE.parts() == {} and make().served_by == HERE
    record, back = through_the_file(make())
    assert "served_by" not in record and back.served_by == HERE
    assert bool(ServedBy(environment=ACTOR)) and bool(ServedBy(generation=REPLICA))
    assert ServedBy.from_json(None) == ServedBy.from_json({}) == HERE


def test_a_completion_is_served_here_unless_a_replica_says_otherwise():
    assert Completion((1,), (-0.5,), "stop").served_by is None
    assert Completion((1,), (-0.5,), "stop", served_by=REPLICA).served_by == REPLICA
