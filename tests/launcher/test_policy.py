"""policy.decide over every state of a small grid: each rule checked as a property."""

from __future__ import annotations

import itertools

from resilient_slurm.launcher.recovery.policy import (
    Action,
    Phase,
    Signal,
    State,
    Watched,
    decide,
    stop_reason,
)

GRID = itertools.product(Phase, Signal, range(4), range(1, 4), range(3), range(4), range(1, 4),
                         range(5), range(4), ("", "node memory folder /x/1 is also node a's"))


def test_every_state() -> None:
    seen: set[Action] = set()
    for phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq, config in GRID:
        s = State(phase, sig, usable, mn, blamed, nop, limit, restarts, maxrq,
                  config_error=config)
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
        if config:  # a configuration error ends the job: no relaunch, requeue or next cycle
            assert a is Action.CONFIG_ERROR and config in decide(s).why, s
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
                     requeues=1, max_requeues=1))
    assert d.action is Action.BUDGET
    assert "budget spent (1/1" in d.why and "< --min-nodes 2" in d.why
    assert "by the launcher" in d.why


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


# -- while a cycle runs: why the watch loop stops it (policy.stop_reason) ------------------

SIGNALS = (Signal.NONE, Signal.TERM, Signal.USR1)
SLOW: tuple[dict[str, str], ...] = ({}, {"n3": "slow: 2.0x median over 50 steps"})
RESTARTS = ((0, None), (5, None), (2, 3), (3, 3), (4, 3))  # (spent, --max-restarts)
FAULTS = ("", "node fault: n2: health verdict fail")


def test_stop_reason_takes_the_first_reason_in_its_order_over_the_whole_grid() -> None:
    for sig, slow, (spent, limit), fault in itertools.product(SIGNALS, SLOW, RESTARTS, FAULTS):
        why = stop_reason(Watched(sig, slow, spent, limit, fault))
        over = limit is not None and spent > limit
        if sig is not Signal.NONE:
            assert why == f"{sig.value} received"
        elif slow:
            assert why == "straggler: n3 slow: 2.0x median over 50 steps"
        elif over:
            assert why == (f"in-job restart budget spent: {spent} restarts of the job > "
                           f"--max-restarts {limit}")
        else:
            assert why == fault  # "" (go on) when nothing stops the cycle


def test_stop_reason_names_every_straggler_sorted() -> None:
    why = stop_reason(Watched(stragglers={"n9": "slow b", "n1": "slow a"}))
    assert why == "straggler: n1 slow a; n9 slow b"
    assert stop_reason(Watched()) == ""


def test_a_configuration_error_stops_the_cycle_at_once() -> None:
    why = "node memory folder /x/1 is also node a's"
    assert stop_reason(Watched(config_error=why, restarts=0, max_restarts=3)) == (
        f"configuration error: {why}")
    assert stop_reason(Watched(Signal.TERM, config_error=why)) == "SIGTERM received"
    assert stop_reason(Watched(stragglers={"n1": "2x"}, config_error=why)).startswith(
        "configuration error")
