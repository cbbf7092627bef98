"""A failed cycle that blamed nobody waits for the nodes' next published verdicts before it
requeues (``evidence.await_fresh``): a node whose GPU was lost a moment before its restarts ran
out has no verdict saying so yet. Pure: the verdicts read and the clock are given."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm import verdict_file
from resilient_slurm.launcher.recovery import blame, evidence

NODES = ["n1", "n2", "n3"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.t += s


def _reader(published: dict[str, list[tuple[float, str]]], clock: Clock):
    """``published``: node -> [(clock time it appears, status)]; a verdict's own time (ts) is
    the clock time it was published."""
    def read(after: float) -> dict[str, verdict_file.Verdict]:
        out = {}
        for node, items in published.items():
            seen = [(t, s) for t, s in items if t <= clock.t and t >= after]
            if seen:
                t, s = seen[-1]
                out[node] = verdict_file.Verdict(status=s, ts=t)
        return out
    return read


@given(st.dictionaries(st.sampled_from(NODES),
                       st.lists(st.tuples(st.floats(0, 120), st.sampled_from(
                           ["ok", "warn", "unknown", "fail"])), max_size=3), max_size=3),
       st.floats(0, 90))
def test_waits_until_every_node_answered_or_one_failed_never_past_the_bound(published,
                                                                           wait_s) -> None:
    clock = Clock()
    for items in published.values():
        items.sort()
    got = evidence.await_fresh(_reader(published, clock), NODES, 0.0, wait_s, every=5.0,
                               clock=clock, sleep=clock.sleep)
    seen = _reader(published, clock)(0.0)
    assert clock.t <= wait_s + 5.0  # never much past the bound
    assert got == (wait_s > 0 and bool(seen))
    if wait_s > 0 and clock.t + 5.0 <= wait_s:  # it stopped early: the answer was complete
        assert len(seen) == len(NODES) or any(v.status == "fail" for v in seen.values())
    if wait_s > 0 and clock.sleeps:  # it slept: the answer before the last sleep was not
        before = _reader(published, _at(clock.t - 5.0))(0.0)
        assert len(before) < len(NODES) and not any(v.status == "fail"
                                                    for v in before.values())


def _at(t: float) -> Clock:
    c = Clock()
    c.t = t
    return c


def test_a_fail_published_after_the_failure_ends_the_wait_at_once() -> None:
    clock = Clock()
    published = {"n3": [(12.0, "fail")], "n1": [(5.0, "ok")]}
    assert evidence.await_fresh(_reader(published, clock), NODES, 1.0, 45.0, every=5.0,
                                clock=clock, sleep=clock.sleep)
    assert clock.t == 15.0  # 0, 5, 10: not yet; 15: n3's fail is there


def test_verdicts_older_than_the_failure_do_not_count() -> None:
    clock = Clock()
    published = {n: [(0.5, "ok")] for n in NODES}  # all taken before the failure at 1.0
    assert not evidence.await_fresh(_reader(published, clock), NODES, 1.0, 20.0, every=5.0,
                                    clock=clock, sleep=clock.sleep)
    assert clock.t == 20.0  # waited the whole bound for something new


def test_no_wait_when_off() -> None:
    clock = Clock()
    assert not evidence.await_fresh(lambda after: {}, NODES, 0.0, 0.0, clock=clock,
                                    sleep=clock.sleep)
    assert clock.sleeps == 0


def test_judged_again_after_the_wait_even_when_no_verdict_could_be_read() -> None:
    """The verdicts cannot be read (a site whose hooks publish elsewhere): the wait ends with
    nothing new, but Slurm's view changed meanwhile (the hooks drained n2), so the second
    judgement blames n2 rather than leaving the first one's 'nobody'."""
    clock = Clock()
    judgements = [blame.Decision(), blame.Decision(blamed={"n2": ["slurm: drained"]})]
    calls: list[float] = []

    def judge() -> evidence.Judged:
        calls.append(clock.t)
        return judgements[len(calls) - 1], []

    decision, _ = evidence.judged_after_wait(judge, lambda after: {}, NODES, 30.0,
                                             clock=clock, sleep=clock.sleep)
    assert decision.blamed == {"n2": ["slurm: drained"]}
    assert calls == [0.0, 30.0]  # judged once at once, once after the whole wait


def test_a_first_judgement_that_blames_waits_for_nothing() -> None:
    clock = Clock()
    first = blame.Decision(blamed={"n1": ["slurm: down"]})
    calls: list[int] = []

    def judge() -> evidence.Judged:
        calls.append(1)
        return first, []

    assert evidence.judged_after_wait(judge, lambda after: {}, NODES, 30.0, clock=clock,
                                      sleep=clock.sleep)[0] is first
    assert calls == [1] and clock.sleeps == 0
