"""Shared harness for ``scripts/demo.py`` and ``bench/run_all.py``: a 4-node sandbox, the seeded
workload, job submission with a time bound, a live follower of the events, and per-run metrics.

Nothing here is a test fixture: it drives the real sandbox cluster (slurmctld, slurmd, hooks) and
the real training script, exactly as a user would through ``sbatch``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechanisms import schedule_check

from resilient_slurm.events import EventKind, read_events
from resilient_slurm.launcher.report import report
from resilient_slurm_lab.faults import TRAIN_SCRIPT as faults_train
from resilient_slurm_lab.faults.injector import Fault, compute_schedule

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN_SCRIPT = REPO / "sbatch" / "train_fsdp.py"
# The example with the lab's fault flags (Workload.train_args' faults go to it).
FAULTS_TRAIN = Path(faults_train)
GATED_TRAIN = REPO / "bench" / "gated_train.py"
JOBS = REPO / "bench" / "jobs"
FSDP_SBATCH = REPO / "sbatch" / "fsdp.sbatch"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")


@dataclass(frozen=True)
class Workload:
    """Same model, steps, checkpoint interval and seeded fault schedule for every mechanism.

    Seed 265 on 60 steps x 3 ranks gives one fault of each type plus a second SIGKILL, at least
    6 steps apart: node@12, hang@22, sigkill@29, exception@36, sigkill@56."""

    nodes: int = 3
    steps: int = 60
    checkpoint_every: int = 5
    step_sleep: float = 0.2
    seed: int = 1234
    fault_count: int = 5
    fault_seed: int = 265
    fault_types: str = "exception,hang,sigkill,node"
    fault_weights: str = "0.4,0.2,0.2,0.2"
    threads: int | None = None  # CPU threads per rank (None: the training's default)

    def train_args(self, ckpt: str, faults: bool = True, sync: bool = False) -> list[str]:
        args = ["--steps", str(self.steps), "--checkpoint-dir", ckpt,
                "--checkpoint-every", str(self.checkpoint_every), "--step-sleep",
                str(self.step_sleep), "--seed", str(self.seed), "--log-every", "1"]
        if sync:
            args.append("--sync-checkpoint")
        if self.threads:
            args += ["--threads", str(self.threads)]
        if faults:
            args += ["--fault-count", str(self.fault_count), "--fault-seed", str(self.fault_seed),
                     "--fault-types", self.fault_types,
                     "--fault-type-weights", self.fault_weights]
        return args

    def schedule(self) -> list[Fault]:
        return compute_schedule(self.fault_count, self.fault_seed, self.fault_types.split(","),
                                self.steps, self.nodes,
                                [float(w) for w in self.fault_weights.split(",")])


def resilient_env(hb_timeout: float = 10, min_nodes: int = 3) -> dict[str, str]:
    """Knobs of ``sbatch/fsdp.sbatch`` (resilient-launch) for the demo and the benchmark."""
    return {"FT_MAX_RESTARTS": "5", "FT_INITIAL_HB_TIMEOUT": "180",
            "FT_HB_TIMEOUT": f"{hb_timeout:g}", "FT_TERM_TIMEOUT": "3",
            "RESILIENT_LAUNCH_ARGS": f"--min-nodes {min_nodes} --max-requeues 3 "
                                     "--health-timeout 30"}


def describe_schedule(schedule: list[Fault]) -> str:
    return ", ".join(f"{f.type}@{f.step}(rank {f.rank})" for f in schedule)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stamp() -> str:
    return time.strftime("%H:%M:%S")


class Cluster:
    """A running sandbox: environment for Slurm commands, node reset, submit and wait."""

    def __init__(self, root: str, nodes: int = 4) -> None:
        self.root = root
        self.n = nodes
        self.conf = os.path.join(root, "etc", "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf, "RESILIENT_SANDBOX_DIR": root,
                    "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                    "PYTHONUNBUFFERED": "1"}
        self.hook_events = os.path.join(root, "log", "events.jsonl")
        from resilient_slurm.slurm import connect

        self.slurm = connect(conf=self.conf, backend="cli", env=self.env)

    def run(self, argv: list[str], timeout: float = 30) -> str:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout,
                           check=False)
        return r.stdout + r.stderr

    def reset_nodes(self, timeout: float = 60) -> None:
        """Every node repaired (scenario cleared), resumed and idle: a clean start per run."""
        from resilient_slurm_lab.hardware.simulate import install_scenario

        for node in self.slurm.nodes():
            if not node.available or node.drain:
                install_scenario(os.path.join(self.root, "nodes", node.name), "clear")
        for node in self.slurm.nodes():
            if not node.available or node.drain:
                try:
                    self.slurm.resume(node.name)
                except Exception as exc:  # noqa: BLE001 - retried by the wait below
                    print(f"[harness] resume {node.name}: {exc}", flush=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.slurm.nodes()
            if all(n.state == "IDLE" and not n.flags for n in nodes):
                return
            for n in nodes:
                if n.drain and time.monotonic() > deadline - timeout / 2:
                    self.slurm.resume(n.name)
            time.sleep(1)
        raise RuntimeError("nodes not idle: " + "; ".join(n.describe() for n in self.slurm.nodes()))

    def submit(self, script: Path, args: list[str], out: str, env: dict[str, str],
               nodes: int = 3) -> int:
        return int(self.slurm.submit(str(script), [f"--nodes={nodes}", "--export=ALL",
                                                   f"--output={out}"], args,
                                     env={**self.env, **env}))

    def submit_as_user(self, script: Path, args: list[str], out: str, env: dict[str, str],
                       nodes: int = 3) -> int:
        """``sbatch`` as the sandbox's unprivileged job user (its clean environment + ``env``)."""
        from resilient_slurm_lab.sandbox import lifecycle

        r = lifecycle.run_as_user(self.root, ["sbatch", "--parsable", f"--nodes={nodes}",
                                              "--export=ALL", f"--output={out}", str(script),
                                              *args], env=env, capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch as the job user failed: {r.stderr.strip()}")
        return int(r.stdout.strip().split(";")[0])

    def wait(self, jid: int, timeout: float, poll: Callable[[str], None] | None = None,
             interval: float = 1.0) -> tuple[str, bool]:
        """Wait until the job ends or ``timeout`` passes (then cancel it). (state, timed_out)."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            try:
                state = self.slurm.job(jid).state
            except Exception:  # noqa: BLE001 - a busy controller: ask again
                state = "?"
            if poll:
                poll(state)
            if state in TERMINAL:
                return state, False
            time.sleep(interval)
        self.slurm.cancel(jid)
        end = time.monotonic() + 30
        while time.monotonic() < end and self.slurm.job(jid).state not in TERMINAL:
            time.sleep(1)
        return state, True


@contextmanager
def sandbox(root: str, nodes: int = 4, timing: str = "fast", watch: bool = True
            ) -> Iterator[Cluster]:
    """A sandbox for a benchmark or the demo; ``watch``: the hooks' node watcher runs on every
    node (``resilient-health watch``). Down on any way out, a stop during ``up`` included."""
    from resilient_slurm_lab.sandbox import lifecycle

    # The mechanisms run side by side, each with its own node fault at the same step: to the
    # hooks' fleet guard that looks like one shared cause. The faults are independent by
    # construction, so the guard is off here (docs/hooks.md#fleet-guard).
    try:
        lifecycle.up(root, nodes=nodes, timing=timing, timeout=max(120, 8 * nodes), watch=watch,
                     hooks_extra="max_drain_fraction = 1.0\nmax_drains_per_interval = 0\n")
        yield Cluster(root, nodes)
    finally:
        lifecycle.down(root, quiet=True)


@dataclass
class Follower:
    """Tails event files and prints one readable line per interesting event."""

    files: list[str]
    steps: int
    every: int = 10
    t0: float = field(default_factory=time.time)
    pos: dict[str, int] = field(default_factory=dict)
    last_step: int = 0
    job_state: str = ""
    hang_ts: float = 0.0  # last hang_detected shown: one line per hang, not one per node
    out: Callable[[str], None] = print

    def line(self, what: str) -> None:
        self.out(f"  [{time.time() - self.t0:6.1f}s] {what}")

    def state(self, state: str) -> None:
        if state != self.job_state and state != "?":
            self.line(f"job {state.lower()}")
            self.job_state = state

    def poll(self) -> None:
        for path in self.files:
            for e in self._new(path):
                self.show(e)

    def _new(self, path: str) -> list[dict[str, Any]]:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(self.pos.get(path, 0))
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind("\n") + 1
        self.pos[path] = self.pos.get(path, 0) + len(data[:end].encode())
        events = []
        for raw in data[:end].splitlines():
            try:
                events.append(json.loads(raw))
            except ValueError:
                continue
        return events

    def show(self, e: dict[str, Any]) -> None:  # noqa: C901 - one branch per event kind
        k, src = e.get("kind"), e.get("source")
        if k == EventKind.PROGRESS:
            s = int(e.get("step") or 0)
            if (s % self.every == 0 or s == self.steps) and s != self.last_step:
                bar = "#" * (20 * s // self.steps)
                self.line(f"step {s:4d}/{self.steps} [{bar:20}] loss {float(e['loss']):.3f}")
                self.last_step = s
        elif k == EventKind.FAULT and src == "training":
            self.line(f"FAULT   {e.get('type')} injected at step {e.get('step')} on rank "
                      f"{e.get('rank')} ({e.get('node')})")
        elif k == EventKind.FAULT:
            self.line(f"launcher: {e.get('type')} (rc {e.get('rc')}) {e.get('detail', '')}")
        elif k == EventKind.RESUME and src == "training":
            how = "fresh start" if e.get("fresh") else f"resumed from step {e.get('step')}"
            how += f" ({e['tier']})" if e.get("tier") else ""
            self.last_step = -1
            self.line(f"training {how}: world {e.get('world_size')}, restart "
                      f"{e.get('restart')}, requeue {e.get('requeue') or 0}")
        elif k == EventKind.CYCLE_START:
            self.line(f"launcher: cycle {e.get('cycle')} on {','.join(e.get('nodes') or [])}")
        elif k == EventKind.STOP_CYCLE:
            self.line(f"launcher: stopping the cycle: {e.get('reason')}")
        elif k == EventKind.BLAME:
            blamed = e.get("blamed") or {}
            why = "; ".join(f"{n}: {(r or ['?'])[0][:70]}" + (f" (+{len(r) - 1} more)"
                                                             if len(r) > 1 else "")
                            for n, r in blamed.items())
            self.line(f"launcher: blame -> {why or 'no node to blame'}")
        elif k == EventKind.HANG_DETECTED and float(e.get("ts", 0)) - self.hang_ts > 5:
            self.hang_ts = float(e.get("ts", 0))
            self.line(f"ft_launcher on {e.get('node')}: no heartbeat from rank {e.get('rank')} "
                      f"for {e.get('waited_s')} s: hang detected, restarting in-job")
        elif k == EventKind.SPARE and e.get("node"):
            self.line(f"launcher: SPARE {e.get('node')} in for {e.get('out')} (its verdict: "
                      f"{e.get('health')}); {len(e.get('spares_left') or [])} spare(s) left")
        elif k == EventKind.EXCLUDE:
            self.line(f"launcher: EXCLUDE {e.get('node')} ({e.get('mode')})")
        elif k == EventKind.RELEASE:
            done = "released to Slurm" if e.get("done") else f"kept ({e.get('reason')})"
            self.line(f"launcher: {','.join(e.get('nodes') or [])} {done}")
        elif k == EventKind.REQUEUE:
            self.line(f"launcher: REQUEUE excluding {','.join(e.get('excluded') or []) or '-'}: "
                      f"{e.get('reason')}")
        elif k == EventKind.VERDICT and src == "launcher":
            self.line(f"launcher: verdict {e.get('verdict')} (exit {e.get('exit_code')})")
        elif k == EventKind.DRAIN:
            self.line(f"{src} hook: DRAIN {e.get('node')} reason {e.get('reason')!r}")
        elif k == EventKind.RESUME and src in ("health", "prolog", "epilog"):
            self.line(f"{src} hook: resume {e.get('node')}")
        elif k == EventKind.COMPLETE:
            self.line(f"training complete at step {e.get('step')}, digest "
                      f"{str(e.get('digest'))[:16]}...")


@dataclass
class RunResult:
    mechanism: str
    job_id: int
    completed: bool
    timed_out: bool
    state: str
    wall_s: float
    productive_s: float
    goodput: float
    final_step: int | None
    digest: str | None
    requeues: int
    restarts_in_job: int
    faults: list[dict[str, Any]]
    lost_steps: int
    excluded: list[str]
    fault_schedule_ok: bool
    fault_schedule: list[str] = field(default_factory=list)  # mechanisms.schedule_check's lines


def training_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("source") == "training"]


def summarize(mechanism: str, jid: int, events_file: str, state: str, timed_out: bool,
              wall_s: float, schedule: list[Fault], requeues: int,
              excluded: list[str], submitted: float | None = None,
              extra: list[dict[str, Any]] | None = None) -> RunResult:
    """Metrics of one run from its events (training + launcher) and the harness's wall time.

    Goodput is :func:`resilient_slurm.goodput.compute`'s (the one definition, shared with
    ``resilient-slurm report`` and the demo): productive step time over wall time from
    ``submitted`` (the harness's clock at ``sbatch``) to the job's end (``submitted + wall_s``)."""
    from resilient_slurm import goodput

    events = sorted([*read_events(events_file), *(extra or [])],
                    key=lambda e: float(e.get("ts", 0)))
    submitted = time.time() - wall_s if submitted is None else submitted
    g = goodput.compute(events, submitted=submitted, ended=submitted + wall_s)
    complete = [e for e in events if e.get("kind") == EventKind.COMPLETE]
    faults = []
    fired = []
    for i, e in enumerate(events):
        if e.get("kind") != EventKind.FAULT or e.get("source") != "training":
            continue
        fired.append(_key(e.get("step"), e.get("rank"), e.get("type")))
        high = max([int(x["step"]) for x in events[:i] if x.get("kind") == EventKind.PROGRESS],
                   default=0)
        detail, j, _, _ = report.handler(events, i)  # the report's classification
        nxt = events[j] if j is not None else None
        # The bench's coarser wording: "in-job restart (ft_launcher)" -> "in-job restart".
        how = detail.split(" (")[0] if nxt is not None else "not recovered"
        faults.append({
            "step": e.get("step"), "rank": e.get("rank"), "type": e.get("type"),
            "node": e.get("node"), "handled_by": how, "detail": detail,
            "recovery_s": round(float(nxt["ts"]) - float(e["ts"]), 1) if nxt else None,
            "lost_steps": max(high - int(nxt.get("step") or 0), 0) if nxt else None})
    restarts = sum(1 for f in faults if f["handled_by"] == "in-job restart")
    expected = [_key(f.step, f.rank, f.type) for f in schedule]
    completed = bool(complete) and state == "COMPLETED"
    return RunResult(
        mechanism=mechanism, job_id=jid, completed=completed, timed_out=timed_out, state=state,
        wall_s=round(wall_s, 1), productive_s=round(g.productive_s or 0.0, 1),
        goodput=round(g.value or 0.0, 4), final_step=g.final_step,
        digest=complete[-1].get("digest") if complete else None,
        requeues=requeues, restarts_in_job=restarts, faults=faults,
        lost_steps=sum(f["lost_steps"] or 0 for f in faults), excluded=excluded,
        fault_schedule_ok=fired == expected[:len(fired)] and (not completed
                                                             or fired == expected),
        fault_schedule=schedule_check([(f.type, f.step, f.rank) for f in schedule], faults,
                                      world_at_steps(events, [f.step for f in schedule])))


def world_at_steps(events: list[dict[str, Any]], steps: list[int]) -> dict[int, int]:
    """The training's world size (its latest ``resume``) when it first completed each of
    ``steps`` (``events`` in time order); a step never reached is left out."""
    out: dict[int, int] = {}
    world = None
    for e in events:
        if e.get("kind") == EventKind.RESUME and e.get("source") == "training" \
                and isinstance(e.get("world_size"), int):
            world = e["world_size"]
        elif e.get("kind") == EventKind.PROGRESS and isinstance(e.get("step"), int) \
                and world is not None:
            out.update({s: world for s in steps if s not in out and s <= e["step"]})
    return out


def _key(step: Any, rank: Any, kind: Any) -> tuple[Any, ...]:
    """A fault as the schedule check compares it: a node fault the harness makes fires at the
    first step it sees at or after the scheduled one, on the node it picks: its type only."""
    return (kind,) if kind == "node" else (step, rank, kind)


def outcome_order(r: RunResult) -> list[str]:
    """What the repeat check compares: fault order and the kind of handling, per run."""
    return [f"{f['type']}@{f['step']}:{str(f['handled_by']).split(' ')[0]}" for f in r.faults] + [
        "completed" if r.completed else "not-completed"]
