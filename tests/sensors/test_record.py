"""The sensor's typed retry record: its dict form is the checkpoint and the trigger's carry."""

from __future__ import annotations

from airflow_batch_provider.sensors.record import Attempt, WaitRecord
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts


def _state(batch_id: str) -> dict:
    return BatchState(
        batch_id=batch_id,
        provider="openai",
        status=BatchStatus.EXPIRED,
        provider_status="expired",
        counts=RequestCounts(total=3, completed=2, failed=1),
        output_file_id="file-out",
        errors=({"code": "batch_expired", "line": 2, "message": "m", "param": None},),
    ).to_dict()


def test_a_record_with_every_field_round_trips_unchanged():
    data = {
        "origin": "b1",
        "attempts": [{"batch_id": "b1", "state": _state("b1")}, {"batch_id": "b3", "replaced": ["b2"]}],
        "cancelled": {"b2": "its task was killed"},
        "token_wait": {"since": 100.0, "resubmit_at": 400.0},
    }
    record = WaitRecord.from_dict(data)
    assert record.current == Attempt("b3", replaced=["b2"])
    assert record.attempts[0].state == BatchState.from_dict(_state("b1"))
    assert record.to_dict() == data


def test_a_fresh_record_holds_the_submitted_batch_only():
    assert WaitRecord.start("b1").to_dict() == {"origin": "b1", "attempts": [{"batch_id": "b1"}], "cancelled": {}}
    # a record written before "cancelled" was always present still loads
    assert WaitRecord.from_dict({"origin": "b1", "attempts": [{"batch_id": "b1"}]}) == WaitRecord.start("b1")
