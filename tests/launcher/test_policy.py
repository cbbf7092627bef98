"""policy.decide over every state of a small grid: each rule checked as a property."""

from __future__ import annotations

import itertools

from resilient_slurm.launcher.policy import Action, Phase, Signal, State, decide

GRID = itertools.product(Phase, Signal, range(4), range(1, 4), range(3), range(4), range(1, 4),
                         range(5), range(4))


def test_every_state() -> None:
    seen: set[Action] = set()
    for phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq in GRID:
        s = State(phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq)
        a = decide(s).action
        seen.add(a)
        assert decide(s) == decide(s)  # pure
        if phase is Phase.COMPLETED:  # a late signal never undoes a success
            assert a is Action.DONE, s
            continue
        assert a is not Action.DONE, s
        if sig is Signal.TERM:  # a cancelled job is never requeued, whenever TERM came
            assert a is Action.TERMINATE, s
            continue
        if a is Action.REQUEUE:  # the budget holds everywhere
            assert restarts < maxrq, s
        if restarts > maxrq:
            assert a is Action.BUDGET, s
            continue
        if sig is Signal.USR1:  # a time-limit warning is never lost: requeue (or budget)
            assert a is (Action.REQUEUE if restarts < maxrq else Action.BUDGET), s
            continue
        if phase is Phase.BEFORE_CYCLE:
            assert (a is Action.RUN_CYCLE) == (usable >= mn), s
            if usable < mn:
                assert a is (Action.REQUEUE if restarts < maxrq else Action.BUDGET), s
            continue
        assert a is not Action.RUN_CYCLE
        assert (a is Action.ELASTIC) == (blamed > 0 and usable >= mn), s
        assert (a is Action.NO_PROGRESS) == (blamed == 0 and nop >= limit), s
        if a not in (Action.ELASTIC, Action.NO_PROGRESS):
            assert a is (Action.REQUEUE if restarts < maxrq else Action.BUDGET), s
    assert seen == set(Action)


def test_reasons_say_why() -> None:
    d = decide(State(Phase.FAILED, Signal.NONE, usable=1, min_nodes=2, blamed=1,
                     restart_count=1, max_requeues=1))
    assert d.action is Action.BUDGET
    assert "budget spent (1/1)" in d.why and "< --min-nodes 2" in d.why


def test_prefer_requeue_never_relaunches_elastically() -> None:
    """--on-straggler requeue: blamed nodes go by requeue (or budget), never elastic; every
    other state decides as without the preference."""
    grid = itertools.product(Phase, Signal, range(4), range(1, 4), range(3), range(4),
                             range(1, 4), range(5), range(4))
    for phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq in grid:
        s = State(phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq)
        p = State(phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq,
                  prefer_requeue=True)
        plain, pref = decide(s).action, decide(p).action
        if plain is Action.ELASTIC:
            assert pref is (Action.REQUEUE if restarts < maxrq else Action.BUDGET), p
        else:
            assert pref is plain, p
