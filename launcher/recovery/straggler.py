"""Straggler verdict: a node that computes slower than its peers, step after step.

Pure functions over the training's ``step_timing`` events (``training/steptime.py``): each
sample gives, for a window of steps, every node's compute seconds per step (its slowest
rank's, collective waits excluded) and wait seconds per step.

``judge`` takes the newest samples covering at least ``window`` steps. For each sample, a
node's ratio is its compute divided by the median compute of the *other* nodes (so two nodes
suffice, and a straggler does not raise its own reference). A node is a straggler when

* the (low) median of its per-sample ratios is >= ``factor``: most samples of the window say
  so, so one noisy sample can neither make it nor hide it (robust to one-off noise), and
* its compute summed over the window, divided by the others' median sum, is >= ``factor``.

No verdict when fewer than ``window`` steps are covered, fewer than two nodes report, or more
than ``max_share`` of the nodes would be blamed at once (a slowdown most nodes share is the
job's, or the machine's, not a node's). A node missing from any sample of the window is not
judged (it was not there the whole time).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resilient_slurm.events import EventKind, EventLog, Straggler, StragglerCause
from resilient_slurm.launcher.recovery.blame import NodeEvidence, strong_reasons

POLICIES = ("exclude", "requeue", "warn")
DEFAULT_FACTOR = 1.3
DEFAULT_WINDOW = 50
DEFAULT_MAX_SHARE = 0.5


@dataclass(frozen=True)
class Sample:
    """One ``step_timing`` event: ``steps`` steps ending at ``step``."""

    step: int
    steps: int
    compute: Mapping[str, float]  # node -> compute seconds per step
    wait: Mapping[str, float]  # node -> collective-wait seconds per step


@dataclass(frozen=True)
class StragglerSettings:
    factor: float = DEFAULT_FACTOR
    window: int = DEFAULT_WINDOW
    max_share: float = DEFAULT_MAX_SHARE
    policy: str = "exclude"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 1.0):
            raise ValueError(f"straggler factor must be a number > 1, got {self.factor}")
        if self.window < 1:
            raise ValueError(f"straggler window must be >= 1 step, got {self.window}")
        if not 0.0 < self.max_share < 1.0:
            raise ValueError(f"straggler max share must be in (0, 1), got {self.max_share}")
        if self.policy not in POLICIES:
            raise ValueError(f"--on-straggler must be one of {', '.join(POLICIES)}, "
                             f"got {self.policy!r}")


@dataclass(frozen=True)
class Verdict:
    node: str
    ratio: float  # low median of the per-sample ratios
    steps: int  # steps the window covered
    first_step: int
    last_step: int
    compute_s: float  # the node's mean compute per step over the window
    median_s: float  # the other nodes' median compute per step over the window
    wait_s: float
    median_wait_s: float

    @property
    def evidence(self) -> str:
        return (f"slow: {self.ratio:.1f}x median over {self.steps} steps "
                f"(steps {self.first_step}-{self.last_step}: compute "
                f"{self.compute_s * 1e3:.0f} ms/step vs median {self.median_s * 1e3:.0f}; waits "
                f"{self.wait_s * 1e3:.0f} ms/step vs median {self.median_wait_s * 1e3:.0f})")

    def as_dict(self) -> Straggler:
        """The ``straggler`` event's evidence fields."""
        return Straggler(node=self.node, ratio=round(self.ratio, 3), steps=self.steps,
                         first_step=self.first_step, last_step=self.last_step,
                         compute_s=round(self.compute_s, 6), median_s=round(self.median_s, 6),
                         wait_s=round(self.wait_s, 6),
                         median_wait_s=round(self.median_wait_s, 6), evidence=self.evidence)


@dataclass(frozen=True)
class Judgement:
    verdicts: tuple[Verdict, ...] = ()
    ratios: Mapping[str, float] | None = None  # node -> median ratio (None: not judged)
    steps: int = 0
    note: str = ""  # why there is no verdict, when there is none

    @property
    def nodes(self) -> list[str]:
        return sorted(v.node for v in self.verdicts)

    @property
    def highest(self) -> float:
        return max(self.ratios.values(), default=0.0) if self.ratios else 0.0


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and v >= 0 else None


def parse_event(ev: Mapping[str, Any]) -> Sample | None:
    """A ``step_timing`` event as a Sample; None for another kind or a malformed one."""
    if ev.get("kind") != EventKind.STEP_TIMING:
        return None
    step, steps, nodes = ev.get("step"), ev.get("steps"), ev.get("nodes")
    if not (isinstance(step, int) and isinstance(steps, int) and steps >= 1 and step >= steps
            and isinstance(nodes, dict) and nodes):
        return None
    compute: dict[str, float] = {}
    wait: dict[str, float] = {}
    for node, rec in nodes.items():
        if not isinstance(rec, dict):
            return None
        c, w = _seconds(rec.get("compute_s")), _seconds(rec.get("wait_s"))
        if c is None or w is None:
            return None
        compute[str(node)], wait[str(node)] = c, w
    return Sample(step, steps, compute, wait)


def samples(events: Iterable[Mapping[str, Any]]) -> list[Sample]:
    return [s for s in (parse_event(e) for e in events) if s is not None]


def window_of(history: Sequence[Sample], window: int) -> list[Sample]:
    """The newest samples covering at least ``window`` steps (all of them if fewer);
    a sample that does not follow the previous one (a restart replayed steps) starts afresh."""
    out: list[Sample] = []
    covered = 0
    for s in reversed(history):
        if out and s.step > out[-1].step - out[-1].steps:  # overlaps the newer one: a replay
            break
        out.append(s)
        covered += s.steps
        if covered >= window:
            break
    return out[::-1]


def _others_median(values: Mapping[str, float], node: str) -> float:
    return statistics.median(v for k, v in values.items() if k != node)


def judge(history: Sequence[Sample], settings: StragglerSettings) -> Judgement:
    """Which nodes are stragglers over the newest ``settings.window`` steps. Pure."""
    win = window_of(history, settings.window)
    covered = sum(s.steps for s in win)
    if covered < settings.window:
        return Judgement(steps=covered, note=f"{covered} of {settings.window} steps seen")
    common = set(win[0].compute)
    for s in win[1:]:
        common &= set(s.compute)
    if len(common) < 2:
        return Judgement(steps=covered, note="fewer than two nodes reported the whole window")
    ratios: dict[str, float] = {}
    totals = {n: sum(s.compute[n] * s.steps for s in win) for n in common}
    waits = {n: sum(s.wait[n] * s.steps for s in win) for n in common}
    found: list[Verdict] = []
    for node in sorted(common):
        per_sample = []
        for s in win:
            ref = _others_median({n: s.compute[n] for n in common}, node)
            per_sample.append(s.compute[node] / ref if ref > 0 else math.inf)
        ratio = statistics.median_low(per_sample)  # a majority of samples, never a tie
        ratios[node] = ratio
        ref_total = _others_median(totals, node)
        total_ratio = totals[node] / ref_total if ref_total > 0 else math.inf
        if ratio >= settings.factor and total_ratio >= settings.factor:
            found.append(Verdict(node, ratio, covered, win[0].step - win[0].steps + 1,
                                 win[-1].step, totals[node] / covered, ref_total / covered,
                                 waits[node] / covered, _others_median(waits, node) / covered))
    if len(found) > settings.max_share * len(common):
        return Judgement(ratios=ratios, steps=covered,
                         note=f"{len(found)} of {len(common)} nodes slow at once: a shared "
                              "slowdown, no node blamed")
    return Judgement(tuple(found), ratios, covered)


def per_node_speed(history: Iterable[Sample]) -> dict[str, list[tuple[int, float]]]:
    """node -> [(step, compute seconds per step)], for the report."""
    out: dict[str, list[tuple[int, float]]] = {}
    for s in history:
        for node, c in s.compute.items():
            out.setdefault(node, []).append((s.step, c))
    return out


class Watch:
    """The launcher's view while a cycle runs: feed it events, ask for new verdicts."""

    def __init__(self, settings: StragglerSettings, nodes: Iterable[str]) -> None:
        self.settings = settings
        self.nodes = set(nodes)
        self.history: list[Sample] = []
        self.reported: set[str] = set()
        self.highest = 0.0

    def feed(self, events: Iterable[Mapping[str, Any]]) -> Judgement | None:
        """Add new ``step_timing`` samples (restricted to this cycle's nodes); the judgement
        when a sample arrived, else None."""
        new = False
        for s in samples(events):
            keep = {n for n in s.compute if n in self.nodes}
            self.history.append(Sample(s.step, s.steps, {n: s.compute[n] for n in keep},
                                       {n: s.wait[n] for n in keep}))
            new = True
        if not new:
            return None
        self.history = window_of(self.history, self.settings.window)
        j = judge(self.history, self.settings)
        self.highest = max(self.highest, j.highest)
        return j

    def fresh(self, j: Judgement) -> list[Verdict]:
        """Verdicts on nodes not reported before (each node is reported once)."""
        out = [v for v in j.verdicts if v.node not in self.reported]
        self.reported.update(v.node for v in out)
        return out


def _at(e: Mapping[str, Any], start: float) -> str:
    return f"+{float(e.get('ts', start)) - start:.1f}s".rjust(9)


def render_speed(events: Sequence[Mapping[str, Any]], start: float, rows: int = 30,
                 columns: int = 8) -> list[str]:
    """The report's "Node speed" section: compute ms per step per node over time (at most
    ``rows`` reports, evenly spread; beyond ``columns`` nodes, the slowest ones), then each
    straggler verdict and when the node was removed (exclusion or requeue). [] when the
    training reported no step timing."""
    timed = [e for e in events if parse_event(e) is not None]
    if not timed:
        return []
    speeds = per_node_speed(samples(timed))
    nodes = sorted(speeds, key=lambda n: -max(c for _, c in speeds[n]))[:columns]
    nodes.sort()
    pick = timed[::max(1, math.ceil(len(timed) / rows))]
    out = ["Node speed (compute ms/step, collective waits excluded; per step_timing report):",
           "  " + f"{'time':>9} {'step':>6} " + " ".join(f"{n[:9]:>9}" for n in nodes)]
    for e in pick:
        s = parse_event(e)
        assert s is not None
        cells = [f"{s.compute[n] * 1e3:9.0f}" if n in s.compute else f"{'-':>9}" for n in nodes]
        out.append(f"  {_at(e, start)} {s.step:6d} " + " ".join(cells))
    for i, e in enumerate(events):
        if e.get("kind") != EventKind.STRAGGLER:
            continue
        node = str(e.get("node"))
        removed = next((x for x in events[i + 1:] if
                        (x.get("kind") == EventKind.EXCLUDE and x.get("node") == node)
                        or (x.get("kind") == EventKind.REQUEUE
                            and node in (x.get("excluded") or []))),
                       None)
        when = (f"removed at {_at(removed, start).strip()} ("
                + ("elastic relaunch without it" if removed.get("kind") == EventKind.EXCLUDE
                   else "requeue excluding it") + ")") if removed else "not removed"
        out.append(f"  {_at(e, start)} straggler {node}: "
                   f"{e.get('evidence')} -> {e.get('action')}; {when}")
    return out


class Monitor:
    """One cycle's straggler watch: :meth:`check` each tick with the events the watch loop's
    tail read since the last tick (``observe.EventTail.fresh``)."""

    def __init__(self, settings: StragglerSettings, nodes: Iterable[str]) -> None:
        self.settings = settings
        self.watch = Watch(settings, nodes)

    @property
    def highest(self) -> float:
        return self.watch.highest

    def check(self, events: Iterable[Mapping[str, Any]]) -> list[Verdict]:
        """Verdicts on nodes not reported before, from ``events`` (new since last time)."""
        j = self.watch.feed(events)
        return self.watch.fresh(j) if j is not None else []

    def poll(self, log: EventLog, events: Iterable[Mapping[str, Any]]) -> dict[str, Verdict]:
        """:meth:`check`, each new straggler reported (event ``straggler``, a log line); the
        ones the policy stops the cycle for (none with ``warn``)."""
        st, new = self.settings, self.check(events)
        for v in new:
            fields = Straggler(action=st.policy, factor=st.factor, window=st.window)
            fields.update(v.as_dict())
            log.emit(EventKind.STRAGGLER, **fields)
            print(f"resilient-launch: straggler {v.node}: {v.evidence} ({st.policy})", flush=True)
        return {v.node: v for v in new if st.policy != "warn"}


def prefers_requeue(settings: StragglerSettings | None, slow: Iterable[str],
                    blamed: Iterable[str]) -> bool:
    """``--on-straggler requeue`` and a straggler among the blamed nodes."""
    return settings is not None and settings.policy == "requeue" \
        and bool(set(slow) & set(blamed))


def report_causes(log: EventLog, evidence: Iterable[NodeEvidence]) -> None:
    """Event ``straggler_cause`` for each straggler among ``evidence``."""
    for ev in evidence:
        if ev.slow:
            others = [r for r in strong_reasons(ev) if r != ev.slow]
            log.emit(EventKind.STRAGGLER_CAUSE, **cause(ev.node, others, ev.verdict))


def cause(node: str, other_reasons: Sequence[str], verdict: str) -> StragglerCause:
    """The ``straggler_cause`` event's fields: the launcher never drains; a node is drained
    only by the hooks, when they found a cause (their ``fail`` verdict, an ``rhc:`` drain, a
    node down): ``other_reasons`` = the node's strong blame reasons besides its slowness."""
    found = "; ".join(other_reasons)
    return StragglerCause(node=node, drained=bool(found), cause=found or None,
                          detail="the hooks found a cause" if found else
                          f"no cause found by the hooks' verdict ({verdict or 'none published'}): "
                          "reported, not drained")
