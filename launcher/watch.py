"""One running cycle's watch: read the events once per tick, gather what stops the step, let
``policy.stop_reason`` decide.

Each :meth:`CycleWatch.tick` reads the job's events file once, within a time budget
(``launcher/cycle/budgeted.py``: a stalled shared filesystem never holds the tick; the checkpoint
scan of ``on_state_check`` likewise) (``observe.EventTail``: the
node shims' observations for the job log, the restart count and the node watch; the
``step_timing`` samples for the straggler monitor), then gathers, cheapest first: a pending
signal (or a ``step_signal`` the tasks got: ``--signal=USR1@T`` without ``B:``), the
straggler monitor's new verdicts (not asked for when a signal already stops the cycle), the
in-job restarts of this cycle, and every ``state_check_interval`` seconds, only when nothing
else stops the cycle, the node watch (``nodewatch``, less the nodes level 0 left out under
``--inprocess``); a fresh ``fail`` in the published verdicts (file reads, no RPC) brings the
node watch forward to this tick (the hooks' node watcher publishes within seconds), and so
does the answer of its batched Slurm query (asked in a worker thread, never waited for).
Last, when nothing else stops the cycle, a fresh precursor in a training node's verdict with
a healthy spare waiting stops it to move off the node (``launcher/recovery/evacuate.py``). The
order of these reasons is :func:`policy.stop_reason`'s; stopping the step is the
supervisor's (``launcher/step.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from resilient_slurm.events import EventKind, Fault, LeftOut
from resilient_slurm.launcher.cycle import budgeted
from resilient_slurm.launcher.recovery import evacuate, level0, nodewatch, policy, straggler
from resilient_slurm.launcher.recovery.policy import Signal
from resilient_slurm.launcher.report import joblog
from resilient_slurm.launcher.shim import observe, restarts, standby
from resilient_slurm.slurm import SlurmBackend


@dataclass(frozen=True)
class Tick:
    """One tick's outcome: ``why`` the cycle stops ("": it goes on), whether the step's tasks
    reported a signal (``step_signal``: the supervisor records it as SIGUSR1), the stragglers
    that stop the cycle this tick (node -> verdict), the nodes it stops to move off
    (``evacuate``: node -> precursor codes)."""

    why: str = ""
    step_signal: bool = False
    slow: dict[str, straggler.Verdict] | None = None
    evacuate: dict[str, tuple[str, ...]] | None = None


class CycleWatch:
    """The watch over one cycle started at ``since`` (wall time) on ``nodes``."""

    def __init__(self, slurm: SlurmBackend, log: joblog.JobLog, nodes: Sequence[str],
                 since: float, events_path: str, verdict_path: str,
                 node_settings: nodewatch.NodeWatchSettings, state_check_interval: float,
                 max_restarts: int | None, cycle_info_dir: str = "",
                 mon: straggler.Monitor | None = None, grace: level0.Level0Grace | None = None,
                 on_state_check: Callable[[], None] = lambda: None,
                 evac: evacuate.Evacuation | None = None,
                 promo: standby.Promotions | None = None,
                 on_promoted: Callable[[dict[str, str], dict[str, str]], None] | None = None
                 ) -> None:
        self.log, self.since, self.cycle_info_dir = log, since, cycle_info_dir
        self.evac = evac
        self.promo, self.on_promoted = promo, on_promoted  # --spares on NVRx >= 0.6
        self.state_check_interval, self.max_restarts = state_check_interval, max_restarts
        self.mon, self.level0, self.on_state_check = mon, grace, on_state_check
        self.tail = observe.EventTail(events_path, since)
        self._read = budgeted.Budgeted(self.tail.read, name="events-read")
        self._on_state_check = budgeted.Budgeted(on_state_check, name="checkpoint-scan")
        self.nodes = nodewatch.NodeWatch(slurm, nodes, since, verdict_path, node_settings)
        self.last_check = time.monotonic()
        self.noted: set[str] = set()
        self.slow: dict[str, straggler.Verdict] = {}  # stragglers that stopped this cycle

    def tick(self, signal: Signal) -> Tick:
        """Read the new events and say whether the cycle stops now (``signal``: the one the
        launcher has pending)."""
        events = self._read(fallback=self.tail.events)  # never waits on a stalled filesystem
        self.log.watch(events, self.since, self.tail.last_step)
        step_signal = any(e.get("kind") == EventKind.STEP_SIGNAL for e in events)
        if signal is Signal.NONE and step_signal:
            signal = Signal.USR1
        stop = self.mon.poll(self.log, self.tail.fresh) \
            if self.mon is not None and signal is Signal.NONE else {}
        self.slow.update(stop)
        seen = policy.Watched(signal, {n: v.evidence for n, v in self.slow.items()} if stop
                              else {}, restarts.in_cycle(events, self.since, self.cycle_info_dir),
                              self.max_restarts, config_error=config_error(events))
        why = policy.stop_reason(seen)
        due = time.monotonic() - self.last_check >= self.state_check_interval
        if not why and (due or self.nodes.answered() or self.nodes.verdict_failing()):
            self.last_check = time.monotonic()
            self._on_state_check(fallback=None)
            why = policy.stop_reason(replace(seen, node_fault=self._node_fault()))
        move = self.evac.poll() if self.evac is not None and not why else {}
        return Tick(why or (evacuate.reason(move) if move else ""), step_signal, stop,
                    move or None)

    def finish(self) -> str:
        """One last read of the events once the step ended (it may have ended before a tick
        saw them): the job log gets their lines, and any fault line still waiting for its
        recovery is written now. The configuration error the training reported this cycle
        ("": none). Bounded as every read here: a read still running from a tick is
        waited for first, then one fresh read."""
        events = self._read(fallback=self.tail.events)
        events = self._read(fallback=events)
        self.log.watch(events, self.since, self.tail.last_step)
        self.log.flush()
        return config_error(events)

    def _node_fault(self) -> str:
        """Why a node fault stops the step now ("" if none): ``nodewatch``'s finding, less
        the nodes level 0 left out; flagged nodes the training does not confirm are logged
        once per cycle and waited for."""
        found = self._past_standby(self.nodes.check(self.tail.events, self.tail.last_progress))
        for node, state in found.waiting.items():
            if node not in self.noted:
                self.noted.add(node)
                self.log.emit(EventKind.FAULT, **Fault(
                    type="node-flagged", node=node, state=state,
                    detail="not a node fault while the training advances: waiting"))
        if found.shared and "shared" not in self.noted:
            self.noted.add("shared")
            self.log.emit(EventKind.FAULT, **Fault(type="shared", detail=found.shared))
        bad = self._past_level0(sorted(found.stop), self.tail.events)
        return policy.NODE_FAULT + "; ".join(f"{n}: {found.stop[n]}" for n in bad) if bad else ""

    def _past_standby(self, found: nodewatch.Finding) -> nodewatch.Finding:
        """``found`` less the bad nodes NVRx's standbys already replaced (``standby.py``:
        recorded once through ``on_promoted``) and the unpromoted standbys (their gates
        stop them)."""
        if self.promo is None:
            return found
        bad = sorted({*found.stop, *found.waiting})
        stop, newly = self.promo.split(bad, self.tail.events)
        if newly and self.on_promoted is not None:
            self.on_promoted(newly, {n: found.stop.get(n) or f"slurm state {found.waiting[n]}"
                                     for n in newly})
        return replace(found, stop={n: w for n, w in found.stop.items() if n in stop},
                       waiting={n: w for n, w in found.waiting.items() if n in stop})

    def _past_level0(self, bad: list[str], events: list[dict[str, Any]]) -> list[str]:
        """The bad nodes that stop the step: all of them, except under ``--inprocess`` those
        level 0 left out (recorded once, ``left_out``) or still has time to
        (launcher/recovery/level0). ``events``: this cycle's, as the tail has read them."""
        if self.level0 is None or not bad:
            return bad
        left = level0.left_out_nodes(events, self.since)
        stop, newly = self.level0.split(bad, left, time.monotonic())
        for node in newly:
            self.log.emit(EventKind.LEFT_OUT, **LeftOut(
                node=node, by="level 0 (in-process restart)",
                reason="bad node whose ranks the training already left out; the step goes on "
                       "without it"))
        return stop


def config_error(events: Sequence[dict[str, Any]]) -> str:
    """The first ``config_error`` event's message, with where it was raised ("": none)."""
    for e in events:
        if e.get("kind") == EventKind.CONFIG_ERROR:
            return f"{e.get('message') or '?'} (rank {e.get('rank', '?')} on {e.get('node', '?')})"
    return ""
