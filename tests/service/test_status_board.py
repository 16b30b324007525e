"""The StatusBoard's phases, derived Ready condition, last operation and change listeners."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from service.status import Event, StatusBoard, _ready_entry, _ready_since
from stacks.models import Address
from stacks.models.conditions import ConditionType, Operation, Phase, Reason, phase_of

KEY = "crawl/a"


class Clock:
    def __init__(self) -> None:
        self.at = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at

    def tick(self) -> None:
        self.at += timedelta(seconds=1)


@pytest.mark.parametrize(
    ("conditions", "running", "deleting", "phase"),
    [
        ({}, False, False, Phase.PENDING),
        ({}, True, False, Phase.PROVISIONING),
        ({"Provisioned": "False"}, False, False, Phase.FAILED),
        ({"Provisioned": "False"}, True, False, Phase.PROVISIONING),
        ({"Provisioned": "True"}, True, False, Phase.READY),  # a run over an applied proxy keeps it Ready
        ({"Provisioned": "True", "Healthy": "False"}, False, False, Phase.DEGRADED),
        ({"Provisioned": "True", "Held": "True"}, False, False, Phase.HELD),
        ({"Provisioned": "True", "Stalled": "True"}, False, False, Phase.STALLED),
        ({"Provisioned": "True", "Stalled": "True"}, False, True, Phase.DELETING),
        ({}, False, True, Phase.DELETING),
    ],
)
def test_phase_of(conditions: dict[str, str], running: bool, deleting: bool, phase: str) -> None:
    assert phase_of(conditions, running=running, deleting=deleting) == phase


def ready(board: StatusBoard) -> tuple[str, str]:
    shown = board.published(KEY)
    assert shown is not None
    condition = next(c for c in shown.conditions if c.type == ConditionType.READY)
    return condition.status, condition.reason


def provision(board: StatusBoard) -> None:
    board.set_condition(KEY, type_=ConditionType.PROVISIONED, true=True, reason=Reason.PROVISIONED)


def test_ready_is_derived_and_borrows_the_reason_in_the_way() -> None:
    board = StatusBoard()
    board.operation_started(KEY, type_=Operation.UP)
    assert board.get(KEY).phase == Phase.PROVISIONING
    assert ready(board) == ("False", Reason.PROVISIONING)
    provision(board)
    board.operation_finished(KEY, type_=Operation.UP, succeeded=True)
    assert ready(board) == ("True", Reason.READY)
    board.set_condition(KEY, type_=ConditionType.HEALTHY, true=False, reason=Reason.PROBE_FAILED, message="x")
    assert ready(board) == ("False", Reason.PROBE_FAILED)
    board.set_condition(KEY, type_=ConditionType.HEALTHY, true=True, reason=Reason.PROBE_SUCCEEDED)
    board.set_condition(KEY, type_=ConditionType.HELD, true=True, reason=Reason.INVALID_SPEC, message="bad")
    assert ready(board) == ("False", Reason.INVALID_SPEC)
    board.set_deleting(KEY)
    assert board.get(KEY).phase == Phase.DELETING
    assert ready(board) == ("False", Reason.DELETING)
    # the stored conditions are what the loop set: Ready is only in the published view
    assert ConditionType.READY not in {c.type for c in board.get(KEY).conditions}


def test_ready_transition_time_moves_only_with_its_status() -> None:
    clock = Clock()
    board = StatusBoard(now=clock)
    provision(board)
    first = board.published(KEY)
    clock.tick()
    board.set_condition(KEY, type_=ConditionType.HEALTHY, true=True, reason=Reason.PROBE_SUCCEEDED)
    again = board.published(KEY)
    assert first is not None
    assert again is not None
    assert first.conditions[-1].last_transition_time == again.conditions[-1].last_transition_time
    clock.tick()
    board.set_condition(KEY, type_=ConditionType.HEALTHY, true=False, reason=Reason.PROBE_FAILED)
    sick = board.published(KEY)
    assert sick is not None
    assert sick.conditions[-1].last_transition_time == clock.at


def test_last_operation_and_observed_generation() -> None:
    clock = Clock()
    board = StatusBoard(now=clock)
    board.operation_started(KEY, type_=Operation.DESTROY)
    started = clock.at
    clock.tick()
    board.operation_finished(KEY, type_=Operation.DESTROY, succeeded=False, message="boom")
    board.set_applied(KEY, stack="s", spec_hash="h", address=Address(host="h", port=1), generation=3)
    status = board.get(KEY)
    assert status.last_operation is not None
    assert (status.last_operation.result, status.last_operation.message) == (Operation.FAILED, "boom")
    assert (status.last_operation.started_at, status.last_operation.finished_at) == (started, clock.at)
    assert status.observed_generation == 3
    board.observe(KEY, generation=4)
    dumped = board.get(KEY).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["observedGeneration"] == 4
    assert dumped["lastOperation"]["type"] == "destroy"


def test_listeners_hear_changes_only() -> None:
    board = StatusBoard()
    changed: list[str] = []
    events: list[Event] = []
    board.subscribe(changed.append)
    board.subscribe_events(events.append)
    provision(board)
    provision(board)  # no transition: no change, no event
    assert changed == [KEY]
    assert [e.reason for e in events] == [Reason.PROVISIONED]
    board.set_applied(KEY, stack="s", spec_hash="h", address=None)
    board.set_applied(KEY, stack="s", spec_hash="h", address=None)
    board.set_egress(KEY, "1.2.3.4")
    board.set_egress(KEY, "1.2.3.4")
    board.set_egress("crawl/unknown", "1.2.3.4")  # no status: nothing to change
    board.set_deleting(KEY)
    board.set_deleting(KEY)
    assert changed == [KEY] * 4
    board.drop(KEY)
    board.drop(KEY)
    assert changed == [KEY] * 5
    assert board.published(KEY) is None
    board.event(KEY, reason=Reason.RELEASED, message="gone")
    assert events[-1].reason == Reason.RELEASED
    assert len(changed) == 5


@given(
    st.booleans(),
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
)
@example(True, datetime(1970, 1, 1, tzinfo=UTC))  # the epoch itself: still True
def test_readys_status_and_time_are_kept_as_one_int_exactly(true: bool, since: datetime) -> None:
    """The board keeps Ready as one int a proxy (status.py `_ready_entry`): status and microseconds."""
    entry = _ready_entry(true, since)
    assert (entry > 0) is true
    assert _ready_since(entry) == since
