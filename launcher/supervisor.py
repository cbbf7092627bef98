"""The cycle loop: launch, wait (watching for node faults and signals), gather evidence, ask
``policy.decide`` what next, act.

Exit codes (the contract, also in ``resilient-launch --help``):

* ``0`` the training completed;
* ``2`` usage or configuration error (also: not inside a Slurm allocation);
* ``3`` no-progress verdict: no new committed checkpoint across ``--no-progress-limit`` cycles
  or requeues (a deterministic crash); the job is not requeued;
* ``4`` budget exhausted: a requeue was needed but ``--max-requeues`` is spent (or requeue
  refused / failed), or too few usable nodes and no requeue left; also ``requeue-unconfirmed``:
  the controller did not answer the requeue within KillWait (it may still take it);
* ``5`` requeued: Slurm restarts this batch script (with blamed nodes excluded);
* ``143`` terminated by SIGTERM (``scancel``, preemption): the training was asked to save and
  the job is left to Slurm (never requeued by us); ``SIGUSR1`` (``--signal=B:USR1@T`` before a
  time limit) instead means save, then requeue;
* ``1`` internal error.

Stopping a cycle signals the step's tasks (``scancel --signal=TERM JOB.STEP``), never ``srun``
(which answers SIGTERM by SIGKILLing every task): ft_launcher and the training get SIGTERM,
may save, and are killed only after ``--term-timeout``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.fsutil import atomic_write
from resilient_slurm.launcher import (
    blame,
    evidence,
    ledger,
    level0,
    observe,
    plan,
    policy,
    progress,
    published,
    straggler,
)
from resilient_slurm.launcher.policy import Action, Phase, Signal
from resilient_slurm.launcher.requeue import budget_for, requeue_excluding
from resilient_slurm.slurm import SlurmBackend, SlurmError

EXIT_DONE, EXIT_ERROR, EXIT_USAGE, EXIT_NO_PROGRESS, EXIT_BUDGET, EXIT_REQUEUED = 0, 1, 2, 3, 4, 5
EXIT_TERMINATED = 143
# What each exit status means, in the order `resilient-launch --help` lists them (its one
# definition: the help text is rendered from it).
EXIT_MEANINGS: tuple[tuple[int, str], ...] = (
    (EXIT_DONE, "training completed"),
    (EXIT_USAGE, "usage or configuration error (also: not inside a Slurm allocation)"),
    (EXIT_NO_PROGRESS, "no-progress verdict: no new step report or complete checkpoint across\n"
     "--no-progress-limit cycles/requeues (a deterministic crash); not requeued.\n"
     "Never issued without a progress signal (the log says so)"),
    (EXIT_BUDGET, "budget exhausted: a requeue was needed but --max-requeues is spent or it "
     "failed\n(requeue-unconfirmed: the controller did not answer within KillWait; it may "
     "still\ntake it, then the job restarts)"),
    (EXIT_REQUEUED, "requeued: Slurm restarts this batch script, blamed nodes excluded"),
    (EXIT_TERMINATED, "terminated by SIGTERM (scancel, preemption): training saved, left to "
     "Slurm;\nSIGUSR1 (sbatch --signal=B:USR1@T) means save, then requeue"),
    (EXIT_ERROR, "internal error"),
)
EXIT_OF = {Action.DONE: EXIT_DONE, Action.TERMINATE: EXIT_TERMINATED,
           Action.NO_PROGRESS: EXIT_NO_PROGRESS, Action.BUDGET: EXIT_BUDGET}
VERDICT_OF = {Action.DONE: "completed", Action.TERMINATE: "terminated",
              Action.NO_PROGRESS: "no-progress", Action.BUDGET: "budget-exhausted"}


@dataclass
class Settings:
    checkpoint_dir: str | None  # None: progress from step reports only
    state_dir: str
    min_nodes: int
    max_requeues: int = 3
    no_progress_limit: int = 3
    max_strikes: int = 2
    max_blame_share: float = 0.5
    verdict_path: str = ""  # published health verdicts, "{node}" per node
    verdict_max_age: float = 300.0
    health_timeout: float = 30.0
    watch_interval: float = 1.0
    state_check_interval: float = 5.0
    checkpoint_marker: str | None = None  # the user's own completion-marker file name
    max_restarts: int | None = None  # in-job restarts per cycle, counted for the whole job
    straggler: straggler.Settings | None = None  # None: no straggler verdicts


class Supervisor:
    """One batch script's run of the cycle loop (a requeued script starts a new one)."""

    def __init__(self, slurm: SlurmBackend, alloc: plan.Allocation, opts: plan.LaunchOptions,
                 features: plan.Features, cfg: Settings, env: Mapping[str, str]) -> None:
        self.slurm, self.alloc, self.opts, self.cfg = slurm, alloc, opts, cfg
        self.features = features
        self.events_path = os.path.join(cfg.state_dir, "events.jsonl")
        self.log = EventLog(self.events_path, "launcher", job=alloc.job_id)
        self.env = {**env, **opts.extra_env, "RESILIENT_EVENTS_FILE": self.events_path,
                    "RESILIENT_STATE_DIR": cfg.state_dir,
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        self.node_ledger = ledger.load(cfg.state_dir, alloc.job_id)
        self.requested_nodes = len(alloc.nodes)  # before any release
        self.proc: subprocess.Popen[bytes] | None = None
        self.signal = Signal.NONE
        self.kill_wait = 30.0
        self.slow: dict[str, straggler.Verdict] = {}  # this cycle's stragglers (stopped it)
        self.said_no_signal = False
        # --inprocess (ft_launcher's --nnodes MIN:N set by inprocess_plan): level 0 may leave
        # a bad node out itself; the heartbeat timeout is how long level 2 waits for it.
        self.level0 = level0.Level0Grace(opts.heartbeat_timeout) if opts.min_nnodes else None

    # -- signals: recorded at any moment, acted on at the next decision or watch tick -------
    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM or self.signal is Signal.NONE:
            self.signal = Signal.TERM if signum == signal.SIGTERM else Signal.USR1

    def _save(self) -> None:
        ledger.save(self.cfg.state_dir, self.node_ledger)

    def _progress_step(self) -> int | None:
        """The training's progress now (the one call the no-progress rule reads): step
        reports or the newest complete checkpoint in any layout (``progress.observe``)."""
        return progress.observe(self.cfg.checkpoint_dir, self.events_path,
                                self.cfg.checkpoint_marker).step

    def _record_progress(self) -> int | None:
        """Count a finished cycle toward the no-progress rule, only when a progress signal
        exists: restarts alone never lead to a no-progress verdict (said once in the log)."""
        p = progress.observe(self.cfg.checkpoint_dir, self.events_path,
                             self.cfg.checkpoint_marker)
        if p.known:
            self.node_ledger.record_progress(p.step)
        elif not self.said_no_signal:
            self.said_no_signal = True
            why = ("no progress signal (no step reports, no complete checkpoint under "
                   f"{self.cfg.checkpoint_dir or 'any --checkpoint-dir'}): the no-progress "
                   "verdict is off; failed cycles are requeued until --max-requeues is spent")
            self.log.emit(EventKind.NO_PROGRESS_SIGNAL, detail=why)
            print(f"resilient-launch: {why}", flush=True)
        return p.step

    def _state(self, phase: Phase, usable: int, blamed: int = 0) -> policy.State:
        return policy.State(phase, self.signal, usable, self.cfg.min_nodes, blamed,
                            self.node_ledger.no_progress, self.cfg.no_progress_limit,
                            self.alloc.restart_count, self.cfg.max_requeues)

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.kill_wait = self.slurm.kill_wait()
        if self.node_ledger.user_excluded is None:
            self.node_ledger.user_excluded = self._user_excluded()
        nodes = self.node_ledger.usable(list(self.alloc.nodes))
        self.log.emit(EventKind.LAUNCH_START, restart_count=self.alloc.restart_count,
                      pid=os.getpid(), allocation=list(self.alloc.nodes), nodes=nodes,
                      excluded=sorted(self.node_ledger.excluded), nvrx=self.features.version,
                      min_nodes=self.cfg.min_nodes, max_requeues=self.cfg.max_requeues,
                      kill_wait=self.kill_wait, committed_step=self._progress_step())
        self._save()
        addrs = evidence.node_addresses(self.slurm, list(self.alloc.nodes))
        while True:
            d = policy.decide(self._state(Phase.BEFORE_CYCLE, len(nodes)))
            if d.action is not Action.RUN_CYCLE:
                return self._act(d)
            self.node_ledger.cycles += 1
            self._save()
            rc, stopped, cycle_dir, started = self._run_cycle(nodes, addrs)
            step = self._record_progress()
            if rc == 0 and not stopped:
                return self._act(policy.decide(self._state(Phase.COMPLETED, len(nodes))))
            self._save()
            if self.signal is not Signal.NONE:
                self.log.emit(EventKind.FAULT, type="signal", signal=self.signal.value,
                              committed_step=step, detail="stopped: "
                              + ("terminated (scancel or preemption)"
                                 if self.signal is Signal.TERM else "time limit warning"))
                return self._act(policy.decide(self._state(Phase.FAILED, len(nodes))))
            if not stopped:
                self.log.emit(EventKind.FAULT, type="cycle-failed", rc=rc, step=step,
                              detail="ft_launcher gave up (in-job restarts exhausted or a "
                                     "node's launcher failed)")
            decision = self._blame(nodes, cycle_dir, started)
            for node, why in decision.blamed.items():
                self.node_ledger.exclude(node, "; ".join(why))
            self._save()
            survivors = [n for n in nodes if n not in decision.blamed]
            prefer = straggler.prefers_requeue(self.cfg.straggler, self.slow, decision.blamed)
            self.slow = {}
            d = policy.decide(replace(self._state(Phase.FAILED, len(survivors),
                                                  len(decision.blamed)), prefer_requeue=prefer))
            if d.action is not Action.ELASTIC:
                return self._act(d)
            for node in decision.nodes:
                self.log.emit(EventKind.EXCLUDE, node=node, mode="elastic", survivors=survivors,
                              reason=decision.blamed[node])
            self.log.emit(EventKind.RECOVERY, by="elastic relaunch", nodes=survivors,
                          excluded=decision.nodes, cycle=self.node_ledger.cycles)
            self._release(decision.nodes)
            nodes = survivors

    def _act(self, d: policy.Decision) -> int:
        if d.action is Action.REQUEUE:
            return self._requeue(d.why)
        return self._verdict(VERDICT_OF[d.action], EXIT_OF[d.action], d.why)

    def _user_excluded(self) -> list[str] | None:
        """The job's own ExcNodeList, read before we ever change it (None: unknown)."""
        if self.alloc.restart_count > 0:
            return None  # an earlier run may have added ours already: keep all of it
        try:
            return sorted(self.slurm.job(self.alloc.job_id).excluded)
        except SlurmError:
            return None

    def _run_cycle(self, nodes: list[str], addrs: Mapping[str, str]
                   ) -> tuple[int, str, str, float]:
        n = self.node_ledger.cycles
        cycle_dir = os.path.join(self.cfg.state_dir, "cycles",
                                 f"r{self.alloc.restart_count}-c{n}")
        cycle = plan.plan_cycle(self.alloc, self.opts, self.features, nodes, addrs, n, cycle_dir,
                              plan.ephemeral_range())
        for path, text in cycle.files:
            atomic_write(path, text)
        started = time.time()
        mon = straggler.Monitor(self.cfg.straggler, nodes, self.events_path) \
            if self.cfg.straggler else None
        self.log.emit(EventKind.CYCLE_START, cycle=n, nodes=nodes, endpoint=cycle.endpoint,
                      rdzv_id=cycle.rdzv_id, committed_step=self._progress_step(),
                      argv=list(cycle.argv))
        self.proc = subprocess.Popen(list(cycle.argv), env=self.env)  # noqa: S603 - argv list
        if self.level0 is not None:
            self.level0.new_cycle()
        stopped = self._watch(nodes, started, cycle.record_dir, mon)
        rc = self.proc.wait()
        self.proc = None
        recs = evidence.exit_records(cycle.record_dir)
        self.log.emit(EventKind.CYCLE_END, cycle=n, rc=rc, stopped=stopped or None,
                      duration_s=round(time.time() - started, 2),
                      straggler_ratio_max=round(mon.highest, 3) if mon else None,
                      node_rc={k: v.get("rc") for k, v in recs.items()})
        return rc, stopped, cycle_dir, started

    def _watch(self, nodes: list[str], since: float, record_dir: str,
               mon: straggler.Monitor | None = None) -> str:
        """Wait for the step; stop it early on a signal, a node fault (a health verdict
        ``fail``, an ``rhc:`` drain, a node Slurm calls down) or a straggler verdict."""
        assert self.proc is not None
        last_check = time.monotonic()
        tail = observe.EventTail(self.events_path, since)
        while self.proc.poll() is None:
            time.sleep(self.cfg.watch_interval)
            why = ""
            spent = observe.restarts_in_cycle(tail.read(), since)
            limit = self.cfg.max_restarts
            if self.signal is not Signal.NONE:
                why = f"{self.signal.value} received"
            elif mon is not None and (stop := mon.poll(self.log)):
                self.slow.update(stop)
                why = straggler.stop_reason(self.slow)
            elif limit is not None and spent > limit:
                why = (f"in-job restart budget spent: {spent} restarts of the job > "
                       f"--max-restarts {limit}")
            elif time.monotonic() - last_check >= self.cfg.state_check_interval:
                last_check = time.monotonic()
                why = self._node_fault(nodes, since, tail.events)
            if why and self.proc.poll() is None:
                self.log.emit(EventKind.STOP_CYCLE, reason=why)
                self._stop_step(record_dir)
                return why
        return ""

    def _node_fault(self, nodes: list[str], since: float,
                    events: list[dict[str, Any]]) -> str:
        evs = [blame.NodeEvidence(node=n, slurm_state=s, drain_reason=r if "DRAIN" in s else "")
               for n, (s, r) in evidence.node_states(self.slurm, nodes).items()]
        bad = self._past_level0(sorted(e.node for e in evs if blame.strong_reasons(e)), since,
                                events)
        if bad:
            return "node fault (slurm state or health hook drain): " + ",".join(bad)
        failed = []
        for n in nodes if self.cfg.verdict_path else []:  # a file read per node, no RPC
            v = published.read(published.path_for(self.cfg.verdict_path, n))
            if v is not None and v.status == blame.FAIL and v.ts >= since:
                failed.append(n)
        failed = self._past_level0(failed, since, events)
        return "health verdict fail: " + ",".join(failed) if failed else ""

    def _past_level0(self, bad: list[str], since: float,
                     events: list[dict[str, Any]]) -> list[str]:
        """The bad nodes that stop the step: all of them, except under ``--inprocess`` those
        level 0 left out (recorded once, ``left_out``) or still has time to (launcher/level0).
        ``events``: this cycle's, as the watch loop's tail has read them."""
        if self.level0 is None or not bad:
            return bad
        left = level0.left_out_nodes(events, since)
        stop, newly = self.level0.split(bad, left, time.monotonic())
        for node in newly:
            self.log.emit(EventKind.LEFT_OUT, node=node, by="level 0 (in-process restart)",
                          reason="bad node whose ranks the training already left out; the "
                                 "step goes on without it")
        return stop

    def _stop_step(self, record_dir: str) -> None:
        """SIGTERM to the step's tasks; SIGKILL once ``--term-timeout`` (+ a margin) passed."""
        assert self.proc is not None
        sid = evidence.step_id(record_dir)
        grace = self.opts.term_timeout + 10
        try:
            if sid is None:
                raise SlurmError("no task of the step has started yet")
            self.slurm.signal_step(self.alloc.job_id, sid, "TERM", timeout=10)
        except SlurmError as exc:
            # A job being cancelled refuses step signals: Slurm is signalling the tasks
            # itself, so they still get their grace. Without any task there is nothing to save.
            self.log.emit(EventKind.STOP_CYCLE, signalled=False, reason=str(exc))
            grace = grace if sid is not None else 0
        if self.signal is Signal.TERM:  # Slurm SIGKILLs this script KillWait after scancel
            grace = min(grace, max(1.0, self.kill_wait * 0.7))
        if self._tasks_ended(record_dir, grace):
            return
        if sid is not None:
            try:
                self.slurm.signal_step(self.alloc.job_id, sid, "KILL", timeout=10)
                self.proc.wait(timeout=10)
                return
            except (SlurmError, subprocess.TimeoutExpired):
                pass
        self.proc.kill()

    def _tasks_ended(self, record_dir: str, timeout: float) -> bool:
        """Wait until srun ended, or every task that started wrote its exit record (a
        cancelled job's srun may linger; the saves are what matter)."""
        assert self.proc is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return True
            started = evidence.step_records(record_dir)
            if started and set(started) <= set(evidence.exit_records(record_dir)):
                try:
                    self.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                return True
            time.sleep(0.2)
        return False

    def _release(self, blamed: list[str]) -> None:
        """Give excluded nodes back to Slurm (shrink the running allocation), so they can be
        repaired instead of idling in this job. The batch host cannot leave; a refusal is
        recorded and the job goes on without the node either way."""
        batch = self.alloc.batch_node
        if batch in blamed:
            self.log.emit(EventKind.RELEASE, nodes=[batch], done=False,
                          reason="the batch host cannot leave the allocation")
        keep = [n for n in self.alloc.nodes if n not in self.node_ledger.excluded or n == batch]
        drop = [n for n in self.alloc.nodes if n not in keep]
        if not drop:
            return
        try:
            self.slurm.shrink(self.alloc.job_id, keep)
        except SlurmError as exc:
            self.log.emit(EventKind.RELEASE, nodes=drop, done=False, reason=str(exc))
            return
        self.env = plan.resized_env(self.env, self.alloc.nodes, keep)
        self.alloc = replace(self.alloc, nodes=tuple(keep))
        self.log.emit(EventKind.RELEASE, nodes=drop, done=True, allocation=keep)

    def _blame(self, nodes: list[str], cycle_dir: str, since: float) -> blame.Decision:
        found = evidence.verdicts(self.cfg.verdict_path, nodes, since, self.cfg.verdict_max_age,
                                  self.alloc.job_id, self.env, os.path.join(cycle_dir, "verdicts"),
                                  self.cfg.health_timeout) if self.cfg.verdict_path else {}
        evs = evidence.gather(self.slurm, nodes, cycle_dir, found,
                              {n: v.evidence for n, v in self.slow.items()})
        decision = blame.decide(evs, self.node_ledger.strikes, self.cfg.max_strikes,
                                self.cfg.max_blame_share)
        straggler.report_causes(self.log, evs)  # drained only by the hooks, for a cause
        for node in decision.strikes:
            self.node_ledger.strike(node)
        self._save()
        self.log.emit(EventKind.BLAME, cycle=self.node_ledger.cycles,
                      blamed=decision.blamed or None,
                      strikes=decision.strike_totals or None,
                      shared_fault=decision.shared_fault or None,
                      evidence=[e.as_dict() for e in evs])
        return decision

    # -- endings ---------------------------------------------------------------------------
    def _verdict(self, verdict: str, code: int, message: str) -> int:
        self._save()
        self.log.emit(EventKind.VERDICT, verdict=verdict, exit_code=code, message=message,
                      cycles=self.node_ledger.cycles, requeues=self.alloc.restart_count,
                      committed_step=self.node_ledger.best_step)
        print(f"resilient-launch: {verdict}: {message} (exit {code})", flush=True)
        return code

    def _readmit(self) -> list[str]:
        """Excluded nodes an admin returned to service and the hooks call healthy since."""
        if not self.node_ledger.excluded or not self.cfg.verdict_path:
            return []
        try:
            states = {n.name: n for n in self.slurm.nodes(sorted(self.node_ledger.excluded))}
        except SlurmError:
            return []
        back = []
        for node, at in sorted(self.node_ledger.excluded_at.items()):
            st = states.get(node)
            v = published.read(published.path_for(self.cfg.verdict_path,
                                                                     node))
            if st is not None and st.available and v is not None and v.status == blame.OK \
                    and v.ts > at:
                self.node_ledger.readmit(node)
                back.append(node)
        return back

    def _requeue(self, why: str) -> int:
        # Last look before acting: a cancelled job is never requeued.
        if self.signal is Signal.TERM:
            return self._act(policy.decide(self._state(Phase.FAILED, 0)))
        back = self._readmit()
        excluded = sorted(self.node_ledger.excluded)
        self.node_ledger.requeues += 1
        self._save()
        self.log.emit(EventKind.REQUEUE, reason=why, excluded=excluded, readmitted=back or None,
                      restart_count=self.alloc.restart_count + 1)
        print(f"resilient-launch: requeueing: {why}", flush=True)
        # Requeue SIGTERMs this script within milliseconds (SIGKILL after KillWait): ignore it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        shrunk = len(self.alloc.nodes) != self.requested_nodes
        res = requeue_excluding(self.slurm, self.alloc.job_id, excluded,
                                budget_s=budget_for(self.kill_wait),
                                num_nodes=self.requested_nodes if shrunk else None,
                                user_excluded=self.node_ledger.user_excluded if back else None)
        if res.unconfirmed:  # a stalled controller may still act on it when it wakes
            return self._verdict("requeue-unconfirmed", EXIT_BUDGET,
                                 f"{res.error}; if the controller takes the requeue when it "
                                 "answers again, the job restarts, else it ends here")
        if not res.requeued:
            return self._verdict("budget-exhausted", EXIT_BUDGET, f"requeue failed: {res.error}")
        if res.error:
            self.log.emit(EventKind.REQUEUE, done=True, warning=res.error)
        return EXIT_REQUEUED
