"""Deterministic, seeded fault injection (torch-free): the lab's, never in the product.

A schedule is a pure function of ``(count, seed, types, weights, steps, world_size)``: the same
inputs give the same ``(step, rank, type)`` list in every launcher, so mechanisms are compared
on equal faults. Faults sit on distinct steps in ``[first_step, steps - 1]``.

Each fault fires at most once, across restarts and requeues: before firing, the injector creates
``<state_dir>/fault_<index>-<step>-<rank>-<type>.fired`` with ``O_EXCL`` (the marker is written
first because a SIGKILL leaves no chance to write afterwards). When the resumed run replays
the step, the marker exists and the fault is skipped.

Types: ``exception`` (raises :class:`InjectedFault`), ``hang`` (sleeps forever: heartbeats stop),
``sigkill`` (the process kills itself with SIGKILL), ``node`` (installs the ``xid79`` scenario in
the sandbox node directory ``$RESILIENT_SANDBOX_DIR/nodes/$SLURMD_NODENAME``, then SIGKILL). A
node fault lasts: :func:`simulated_gpu_lost` is the sandbox's stand-in for CUDA init failing on a
node whose GPU fell off the bus; the wrapper (``faults/train.py``) calls it before training, so a
restart there fails at once, as it would on a cluster, until the node is repaired.

Targeted faults (``--fault TYPE@STEP[@WHERE]``, for tests and demos that need a fault on a given
node): ``WHERE`` is a node name (fires on that node's local rank 0) or ``rankN`` (default
``rank0``). They fire once like scheduled ones, except type ``crash``: an exception raised every
time the step is reached (a deterministic bug, which no restart can get past), and type
``slow`` (``slow@STEP@NODE[:FACTOR]``, default factor 2): from STEP on, every rank of that node
(every local rank, not only the first) computes FACTOR times slower, through every restart, for
as long as the node takes part (a straggler: the training calls :meth:`FaultInjector.slowdown`
after each step's compute and sleeps what it says). Its ``fault`` event is emitted once.

Environment (the wrapper's flags win over env): ``RESILIENT_FAULT_COUNT``, ``RESILIENT_FAULT_SEED``,
``RESILIENT_FAULT_TYPES``, ``RESILIENT_FAULT_TYPE_WEIGHTS``, ``RESILIENT_FAULT_STATE_DIR``.
Every fired fault is appended as event ``kind=fault`` to ``$RESILIENT_EVENTS_FILE`` when set.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.events import Fault as FaultEvent

FAULT_TYPES = ("exception", "hang", "sigkill", "node")
TARGETED_TYPES = (*FAULT_TYPES, "crash", "slow")
DEFAULT_SLOW_FACTOR = 2.0
NODE_SCENARIO = "xid79"


class InjectedFault(RuntimeError):
    """Raised by an ``exception`` fault."""


class FaultConfigError(ValueError):
    """The fault options are inconsistent or cannot be honoured here."""


@dataclass(frozen=True)
class Fault:
    index: int
    step: int
    rank: int
    type: str

    @property
    def marker_name(self) -> str:
        return f"fault_{self.index:03d}-{self.step}-{self.rank}-{self.type}.fired"


@dataclass(frozen=True)
class FaultOptions:
    count: int = 0
    seed: int = 0
    types: tuple[str, ...] = ("exception", "hang", "sigkill")
    weights: tuple[float, ...] | None = None
    state_dir: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> FaultOptions:
        """Options from ``RESILIENT_FAULT_*`` env vars; non-None ``overrides`` (flags) win."""
        env = os.environ if env is None else env
        vals: dict[str, object] = {}
        if env.get("RESILIENT_FAULT_COUNT"):
            vals["count"] = int(env["RESILIENT_FAULT_COUNT"])
        if env.get("RESILIENT_FAULT_SEED"):
            vals["seed"] = int(env["RESILIENT_FAULT_SEED"])
        if env.get("RESILIENT_FAULT_TYPES"):
            vals["types"] = env["RESILIENT_FAULT_TYPES"]
        if env.get("RESILIENT_FAULT_TYPE_WEIGHTS"):
            vals["weights"] = env["RESILIENT_FAULT_TYPE_WEIGHTS"]
        if env.get("RESILIENT_FAULT_STATE_DIR"):
            vals["state_dir"] = env["RESILIENT_FAULT_STATE_DIR"]
        vals.update({k: v for k, v in overrides.items() if v is not None})
        types = vals.get("types", cls.types)
        if isinstance(types, str):
            types = tuple(t.strip() for t in types.split(",") if t.strip())
        weights = vals.get("weights")
        if isinstance(weights, str):
            weights = tuple(float(w) for w in weights.split(",") if w.strip())
        return cls(count=int(vals.get("count", 0)), seed=int(vals.get("seed", 0)),  # type: ignore[call-overload]
                   types=tuple(types),  # type: ignore[arg-type]
                   weights=tuple(weights) if weights is not None else None,  # type: ignore[arg-type]
                   state_dir=vals.get("state_dir"))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Targeted:
    """A fault on a named node or rank: ``TYPE@STEP[@NODE|@rankN]``."""

    index: int
    step: int
    type: str
    node: str | None = None
    rank: int | None = None
    factor: float = 1.0  # ``slow`` only: how many times slower the node computes

    @property
    def marker_name(self) -> str:
        where = self.node if self.node is not None else f"rank{self.rank}"
        return f"targeted_{self.index:03d}-{self.step}-{self.type}-{where}.fired"

    def applies(self, rank: int, local_rank: int, node: str | None) -> bool:
        """Whether it fires in this process: on the named node (its local rank 0), or on live
        rank N. A ``rankN`` fault of a job that shrank to N ranks or fewer fires nowhere (it
        is skipped, never moved onto another rank: see ``FaultInjector.skipped``)."""
        if self.node is not None:
            return self.node == node and (local_rank == 0 or self.type == "slow")
        return self.rank == rank


_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def parse_targeted(specs: Sequence[str]) -> list[Targeted]:
    """``["node@5@node3", "hang@7", "slow@10@node2:1.5"]`` -> targeted faults;
    FaultConfigError on a bad spec."""
    out = []
    for i, spec in enumerate(specs):
        parts = spec.split("@")
        if len(parts) not in (2, 3) or parts[0] not in TARGETED_TYPES:
            raise FaultConfigError(f"bad fault {spec!r}: expected TYPE@STEP[@NODE|@rankN] with "
                                   f"TYPE one of {', '.join(TARGETED_TYPES)}")
        try:
            step = int(parts[1])
        except ValueError:
            step = 0
        if step < 1:
            raise FaultConfigError(f"bad fault {spec!r}: STEP must be an integer >= 1")
        where = parts[2] if len(parts) == 3 else "rank0"
        factor = 1.0
        if parts[0] == "slow":
            where, factor = _slow_target(spec, where)
        m = re.fullmatch(r"rank(\d+)", where)
        if m:
            out.append(Targeted(i, step, parts[0], rank=int(m.group(1)), factor=factor))
        elif _NODE_NAME.match(where):
            out.append(Targeted(i, step, parts[0], node=where, factor=factor))
        else:
            raise FaultConfigError(f"bad fault {spec!r}: {where!r} is neither rankN nor a "
                                   "node name")
    return out


def _slow_target(spec: str, where: str) -> tuple[str, float]:
    """``NODE[:FACTOR]`` of a ``slow`` fault; the factor must be a finite number > 1."""
    if ":" not in where:
        return where, DEFAULT_SLOW_FACTOR
    where, text = where.rsplit(":", 1)
    try:
        factor = float(text)
    except ValueError:
        factor = 0.0
    if not 1.0 < factor < 1000.0:
        raise FaultConfigError(f"bad fault {spec!r}: FACTOR must be a number > 1 (and < 1000)")
    return where, factor


def compute_schedule(count: int, seed: int, types: Sequence[str], steps: int, world_size: int,
                     weights: Sequence[float] | None = None, first_step: int = 1) -> list[Fault]:
    """The fault schedule, sorted by step. Pure and deterministic."""
    if count < 0:
        raise FaultConfigError("fault count must be >= 0")
    if count == 0:
        return []
    unknown = [t for t in types if t not in FAULT_TYPES]
    if unknown or not types:
        raise FaultConfigError(f"fault types must be a non-empty subset of {FAULT_TYPES}, "
                               f"got {list(types)}")
    w = list(weights) if weights is not None else [1.0] * len(types)
    if len(w) != len(types) or any(x < 0 for x in w) or sum(w) <= 0:
        raise FaultConfigError(f"fault type weights {w} do not match types {list(types)}")
    if world_size < 1:
        raise FaultConfigError("world size must be >= 1")
    candidates = list(range(max(first_step, 0), steps))
    if count > len(candidates):
        raise FaultConfigError(f"{count} faults do not fit in steps [{first_step}, {steps - 1}]")
    rng = random.Random(f"resilient-faults:{seed}")
    chosen = sorted(rng.sample(candidates, count))
    return [Fault(i, step, rng.randrange(world_size), rng.choices(list(types), w)[0])
            for i, step in enumerate(chosen)]


def node_dir_from_env(env: Mapping[str, str] | None = None) -> str:
    """The sandbox directory of this process's node; raises FaultConfigError if unknown."""
    env = os.environ if env is None else env
    root, node = env.get("RESILIENT_SANDBOX_DIR"), env.get("SLURMD_NODENAME")
    if not root or not node:
        raise FaultConfigError("a 'node' fault needs RESILIENT_SANDBOX_DIR and SLURMD_NODENAME "
                               "(run inside the sandbox cluster), or drop 'node' from "
                               "--fault-types")
    return os.path.join(root, "nodes", node)


def simulated_gpu_lost(env: Mapping[str, str] | None = None) -> str | None:
    """Why this node's simulated GPU is unusable (its sandbox scenario marks a GPU ``lost``),
    or None: off the sandbox, or when the scenario cannot be read (the job user cannot read a
    root-only one; the hardware is then taken as working, the health checks still see it)."""
    from resilient_slurm.config import tomllib

    env = os.environ if env is None else env
    root, node = env.get("RESILIENT_SANDBOX_DIR"), env.get("SLURMD_NODENAME")
    if not root or not node:
        return None
    try:
        with open(os.path.join(root, "nodes", node, "scenario.toml"), "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        return None
    gpus = data.get("gpus")
    lost = [i for i, g in (gpus.items() if isinstance(gpus, dict) else ())
            if isinstance(g, dict) and g.get("lost")]
    return f"{node}: GPU {','.join(lost)} has fallen off the bus" if lost else None


class FaultInjector:
    """Fires this rank's scheduled faults, each at most once across restarts."""

    def __init__(self, options: FaultOptions, steps: int, rank: int, world_size: int,
                 state_dir: str, events_file: str | None = None,
                 env: Mapping[str, str] | None = None,
                 actions: Mapping[str, Callable[[Fault], None]] | None = None,
                 targeted: Sequence[Targeted] = (), local_rank: int = 0) -> None:
        self.env = os.environ if env is None else env
        self.rank = rank
        self.state_dir = options.state_dir or state_dir
        self.schedule = compute_schedule(options.count, options.seed, options.types, steps,
                                         world_size, options.weights)
        weights = options.weights or [1.0] * len(options.types)
        pairs = zip(options.types, weights, strict=False)
        wants_node = any(t == "node" and w > 0 for t, w in pairs)
        self.node_dir: str | None = None
        if (options.count > 0 and wants_node) or any(t.type == "node" for t in targeted):
            self.node_dir = node_dir_from_env(self.env)  # loud, at schedule time
        self.options, self.steps = options, steps
        self.mine = {f.step: f for f in self.schedule if f.rank == rank}
        self._all_targeted, self._local_rank = list(targeted), local_rank
        self._pick_targeted(None)
        self._slow_seen: set[int] = set()
        events_file = events_file if events_file is not None else self.env.get(
            "RESILIENT_EVENTS_FILE")
        self.events = EventLog(events_file, "training") if events_file else None
        self.actions: dict[str, Callable[[Fault], None]] = {
            "exception": self._raise, "hang": self._hang, "sigkill": self._sigkill,
            "node": self._node,
        }
        if actions:
            self.actions.update(actions)

    def set_world(self, schedule_world: int, live_world: int) -> None:
        """Draw the schedule over ``schedule_world`` ranks, a size fixed for the job's life
        (an elastic job's virtual shards), and fire a fault of rank ``r`` on rank
        ``r % live_world``: a job that shrank meets the same faults as one that did not. A
        targeted ``rankN`` fault is aimed at live rank N: with N >= ``live_world`` it is
        skipped (``skipped``), and rank 0 says so when it reaches the fault's step."""
        o = self.options
        self.schedule = compute_schedule(o.count, o.seed, o.types, self.steps, schedule_world,
                                         o.weights)
        self.mine = {f.step: f for f in self.schedule if f.rank % live_world == self.rank}
        self._pick_targeted(live_world)

    def _pick_targeted(self, live_world: int | None) -> None:
        node = self.env.get("SLURMD_NODENAME")
        mine = [t for t in self._all_targeted if t.applies(self.rank, self._local_rank, node)]
        self._live_world, self.skipped = live_world, {
            t.step: t for t in self._all_targeted
            if t.rank is not None and live_world is not None and t.rank >= live_world}
        self.targeted = {t.step: t for t in mine if t.type != "slow"}
        self.slow = sorted((t for t in mine if t.type == "slow"), key=lambda t: t.step)

    def fired(self) -> list[Fault]:
        return [f for f in self.schedule if os.path.exists(
            os.path.join(self.state_dir, f.marker_name))]

    def maybe_fire(self, step: int) -> None:
        """Call once per step, before the step's work; fires this rank's fault for ``step``."""
        if (gone := self.skipped.get(step)) is not None and self.rank == 0:
            print(f"[fault] {gone.type}@{step}@rank{gone.rank} skipped: the job has "
                  f"{self._live_world} rank(s) now, no rank {gone.rank}", flush=True)
        target = self.targeted.get(step)
        if target is not None and (target.type == "crash" or self._claim(target)):
            self._fire(Fault(target.index, step, self.rank,
                             "exception" if target.type == "crash" else target.type),
                       target.type)
        fault = self.mine.get(step)
        if fault is not None and self._claim(fault):
            self._fire(fault, fault.type)

    def slowdown(self, step: int, compute_s: float) -> float:
        """Seconds this rank must sleep after ``step``'s compute (``compute_s`` seconds) to be
        a ``slow`` fault's straggler: ``(FACTOR - 1) * compute_s`` from its step on, else 0.
        The first time, a ``fault`` event (type ``slow``, ``factor``) is emitted, once per
        job (the marker file)."""
        active = [t for t in self.slow if step >= t.step]
        if not active:
            return 0.0
        target = active[-1]
        if target.index not in self._slow_seen and self._claim(target) \
                and self.events is not None:
            self.events.emit(EventKind.FAULT, **FaultEvent(
                step=step, rank=self.rank, type="slow", factor=target.factor,
                index=target.index, node=self.env.get("SLURMD_NODENAME"), pid=os.getpid()))
            print(f"[fault] rank {self.rank} computes {target.factor:g}x slower from step "
                  f"{step}", flush=True)
        self._slow_seen.add(target.index)
        return max(0.0, (target.factor - 1.0) * compute_s)

    def _fire(self, fault: Fault, kind: str) -> None:
        if self.events is not None:
            self.events.emit(EventKind.FAULT, **FaultEvent(
                step=fault.step, rank=fault.rank, type=kind, index=fault.index,
                node=self.env.get("SLURMD_NODENAME"), pid=os.getpid()))
        print(f"[fault] injecting {kind} at step {fault.step} on rank {fault.rank}",
              flush=True)
        self.actions[fault.type](fault)

    def _claim(self, fault: Fault | Targeted) -> bool:
        os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, fault.marker_name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            rec = {**asdict(fault), "time": time.time(), "pid": os.getpid(),
                   "node": self.env.get("SLURMD_NODENAME")}
            os.write(fd, (json.dumps(rec) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    @staticmethod
    def _raise(fault: Fault) -> None:
        raise InjectedFault(f"injected exception at step {fault.step} on rank {fault.rank}")

    @staticmethod
    def _hang(fault: Fault) -> None:
        while True:
            time.sleep(3600)

    @staticmethod
    def _sigkill(fault: Fault) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def _node(self, fault: Fault) -> None:
        """The node gets NODE_SCENARIO (the lab's simulated hardware); SIGKILL."""
        from resilient_slurm_lab.hardware.simulate import install_scenario

        assert self.node_dir is not None
        install_scenario(self.node_dir, NODE_SCENARIO)
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    """Print a schedule as JSON lines: ``python -m resilient_slurm_lab.faults.injector --count 5
    --seed 42 --types exception,hang --steps 200 --world-size 8``."""
    import argparse

    p = argparse.ArgumentParser(description="Print the fault schedule for these options.")
    p.add_argument("--count", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--types", default=None)
    p.add_argument("--weights", default=None)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    a = p.parse_args(argv)
    o = FaultOptions.from_env(count=a.count, seed=a.seed, types=a.types, weights=a.weights)
    for f in compute_schedule(o.count, o.seed, o.types, a.steps, a.world_size, o.weights):
        print(json.dumps(asdict(f)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
