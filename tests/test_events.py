"""The event kinds: one enumeration, written to disk as plain strings. No Slurm needed."""

from __future__ import annotations

import json

import pytest

from resilient_slurm.events import EventKind, EventLog, read_events
from resilient_slurm.launcher.shim import observe


def test_a_kind_is_written_as_its_plain_string(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    event = EventLog(str(path), "health", node="n1").emit(EventKind.DRAIN, reason="rhc:XID79")
    line = path.read_text()
    assert '"kind": "drain", "source": "health", "node": "n1"' in line
    assert type(json.loads(line)["kind"]) is str
    assert line == json.dumps({**event, "kind": "drain"}) + "\n"  # byte-identical
    assert [e["kind"] for e in read_events(str(path))] == [EventKind.DRAIN]


def test_an_unknown_kind_is_refused(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    with pytest.raises(ValueError, match="drained"):
        EventLog(str(path), "health").emit("drained")  # type: ignore[arg-type]
    assert not path.exists()


def test_members_compare_and_hash_as_their_strings() -> None:
    assert EventKind.PROGRESS == "progress" and "progress" in {EventKind.PROGRESS}
    assert f"{EventKind.STEP_TIMING:12}|" == "step_timing |"
    assert str(EventKind.CYCLE_START) == "cycle_start"
    assert len({k.value for k in EventKind}) == len(EventKind)


def test_every_observation_is_a_kind() -> None:
    assert observe.WATCHED <= set(EventKind)
    assert all(isinstance(kind, EventKind) for kind, _ in observe.PATTERNS)


def test_every_event_kind_has_a_typed_payload() -> None:
    """A reader finds what each kind carries in one place: every EventKind has its payload
    types in PAYLOADS, each a TypedDict."""
    from resilient_slurm.events import PAYLOADS

    assert set(EventKind) - set(PAYLOADS) == set(), "EventKind members without a payload type"
    for kind, types in PAYLOADS.items():
        assert types, kind
        for t in types:
            assert isinstance(t, type) and issubclass(t, dict), (kind, t)
            assert t.__optional_keys__ or t.__required_keys__, (kind, t)  # type: ignore[attr-defined]
