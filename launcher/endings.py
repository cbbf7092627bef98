"""How a launcher run ends: a verdict, or a requeue (the supervisor's endings, a mixin of
``launcher/supervisor.py``'s ``Supervisor``, which holds the state they read).

Two requeue sequences:

* after a fault (blamed nodes, in-job restarts spent): the exclusions are reviewed first
  (readmission, with verdicts read on the allocation's nodes), the fit is checked (a job that
  could never start again ends with ``cannot-fit`` instead), then ``requeue.take``;
* after SIGUSR1 (the time-limit warning): ``requeue.take`` first, its call retried until
  shortly before the job's end (``launcher/recovery/timelimit.py``); everything else (the cycle's
  records, the events, the ledger, the review from what is readable without the allocation,
  the fit) comes after it, while the job pends, within the KillWait budget. A job that can
  never start again is then cancelled with ``cannot-fit``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from resilient_slurm import events
from resilient_slurm.events import EventKind
from resilient_slurm.launcher.cycle import budgeted, plan, progress
from resilient_slurm.launcher.recovery import actions, exclusions, ledger, policy, timelimit
from resilient_slurm.launcher.recovery.exits import EXIT_CANNOT_FIT, EXIT_REQUEUED
from resilient_slurm.launcher.recovery.policy import Phase, Signal
from resilient_slurm.launcher.recovery.requeue import budget_for, take, update_pending
from resilient_slurm.launcher.report import joblog
from resilient_slurm.launcher.settings import SupervisorSettings
from resilient_slurm.slurm import SlurmBackend, SlurmError


class Endings:
    """Verdicts and requeues; the attributes below are the supervisor's."""

    slurm: SlurmBackend
    alloc: plan.Allocation
    cfg: SupervisorSettings
    env: dict[str, str]
    log: joblog.JobLog
    node_ledger: ledger.Ledger
    progress: progress.Tracker
    signal: Signal
    kill_wait: float
    end_time: float | None
    requested_nodes: int
    standby: list[str]
    release: Callable[[list[str]], None]
    _save: Callable[[], None]
    _metrics: Callable[[], None]
    _cycle_ended: Callable[[], None]
    _state: Callable[..., policy.State]

    def _act(self, d: policy.Decision) -> int:
        """Carry out a decision that ends the run (``launcher/recovery/actions.py``)."""
        return actions.end(self, d)

    def verdict(self, verdict: str, code: int, message: str, **fields: Any) -> int:
        """End with ``verdict``: its event, the metrics, one line; returns ``code``."""
        self._save()
        self.log.emit(EventKind.VERDICT, **events.LaunchVerdict(
            verdict=verdict, exit_code=code, message=message, cycles=self.node_ledger.cycles,
            requeues=self.node_ledger.requeues, restart_count=self.alloc.restart_count,
            committed_step=self.node_ledger.best_step), **fields)
        self._metrics()
        print(f"resilient-launch: {verdict}: {message} (exit {code})", flush=True)
        return code

    def _readmit(self) -> list[str]:
        """Review the exclusions before a requeue (``launcher/recovery/exclusions.py``): readmit
        nodes healthy since, expire old ones nothing re-confirms; the nodes that are back."""
        r = exclusions.reconsider(
            self.slurm, self.node_ledger, self.cfg.verdict_path, self.alloc, self.env,
            os.path.join(self.cfg.state_dir, "readmit",
                         f"r{self.alloc.restart_count}-c{self.node_ledger.cycles}"),
            self.cfg.health_timeout, self.cfg.exclusion_ttl, self.log)
        return sorted(r.readmitted)

    def requeue(self, why: str) -> int:
        """Requeue the job (after SIGUSR1: :meth:`_requeue_first`; a pending SIGTERM: the
        verdict it calls for); its exit status."""
        # Last look before acting: a cancelled job is never requeued.
        if self.signal is Signal.TERM:
            return self._act(policy.decide(self._state(Phase.FAILED, 0)))
        if self.signal is Signal.USR1:
            return self._requeue_first(why, after_cycle=False)
        back = self._readmit()
        excluded = sorted(self.node_ledger.excluded)
        fit = exclusions.fit(self.slurm, self.alloc.job_id, excluded, self.requested_nodes,
                             self.node_ledger.user_excluded if back else None)
        if fit.ok is False:
            return self.verdict("cannot-fit", EXIT_CANNOT_FIT,
                                 exclusions.verdict_message(fit, excluded), fit=fit.as_dict(),
                                 excluded=excluded, wanted=why)
        self.node_ledger.requeues += 1
        self._save()
        self.log.emit(EventKind.REQUEUE, **events.Requeue(
            reason=why, excluded=excluded, readmitted=back or None,
            restart_count=self.alloc.restart_count + 1, requeues=self.node_ledger.requeues,
            fit=fit.as_dict()))
        self._metrics()
        print(f"resilient-launch: requeueing: {why}", flush=True)
        taken = take(self.slurm, self.alloc.job_id, excluded, self.kill_wait,
                     self._num_nodes(), self.node_ledger.user_excluded if back else None)
        if taken.verdict is not None:
            return self.verdict(*taken.verdict)
        if taken.warning:
            self.log.emit(EventKind.REQUEUE, **events.Requeue(done=True, warning=taken.warning))
        return EXIT_REQUEUED

    def _num_nodes(self) -> int | None:
        """The node count the requeue restores (None: the job never released a node)."""
        return self.requested_nodes if len(self.alloc.nodes) != self.requested_nodes else None

    def _requeue_first(self, why: str, after_cycle: bool) -> int:
        """The time-limit requeue (SIGUSR1; its step, if any, already stopped): ``scontrol
        requeue`` (with the ledger's exclusions) is the first call to the controller or to
        shared storage, retried until shortly before the job's end (``timelimit``); then,
        while the job pends (Slurm's SIGKILL comes KillWait after the requeue): the cycle's
        records, the fault and requeue events, the ledger, and the review of exclusions
        (:meth:`_review_pending`)."""
        excluded = sorted(self.node_ledger.excluded)
        t0 = time.monotonic()
        taken = take(self.slurm, self.alloc.job_id, excluded, self.kill_wait, self._num_nodes(),
                     None, timelimit.requeue_window(self.signal, self.kill_wait,
                                                    self.end_time, time.time()))
        took = time.monotonic()
        self._cycle_ended()
        if after_cycle:
            p = budgeted.Budgeted(self.progress.finished_cycle, name="progress")(
                progress.Progress(None, None))
            if p.known:
                self.node_ledger.record_progress(p.step)
            self.log.emit(EventKind.FAULT, **events.Fault(
                type="signal", signal=self.signal.value, committed_step=p.step,
                detail="stopped: time limit warning"))
        if taken.verdict is not None:
            return self.verdict(*taken.verdict)
        self.node_ledger.requeues += 1
        self._save()
        self.log.emit(EventKind.REQUEUE, **events.Requeue(
            reason=why, excluded=excluded, restart_count=self.alloc.restart_count + 1,
            requeues=self.node_ledger.requeues, took_s=round(took - t0, 2)))
        if taken.warning:
            self.log.emit(EventKind.REQUEUE, **events.Requeue(done=True, warning=taken.warning))
        print(f"resilient-launch: requeued: {why}", flush=True)
        code = self._review_pending(why, took + budget_for(self.kill_wait))
        self._metrics()
        return code

    def _review_pending(self, why: str, until: float) -> int:
        """After a time-limit requeue, before ``until`` (monotonic): review the exclusions
        from what is readable without the allocation (Slurm's node states, verdict files this
        host sees, the TTL), write a shorter ``ExcNodeList`` when nodes came back, and check
        the fit: a job that can never start again is cancelled with ``cannot-fit``."""
        if not self.node_ledger.excluded:
            return EXIT_REQUEUED

        def left() -> float:
            return max(0.5, until - time.monotonic())

        r = exclusions.reconsider(
            self.slurm, self.node_ledger, self.cfg.verdict_path, replace(self.alloc, nodes=()),
            self.env, "", left(), self.cfg.exclusion_ttl, self.log, query_timeout=left())
        excluded = sorted(self.node_ledger.excluded)
        user = self.node_ledger.user_excluded if r.readmitted else None
        if r.readmitted:
            self._save()
            if err := update_pending(self.slurm, self.alloc.job_id, excluded, user, left()):
                self.log.emit(EventKind.REQUEUE, **events.Requeue(
                    done=True, readmitted=sorted(r.readmitted),
                    warning=f"readmitted nodes still excluded: {err}"))
        fit = exclusions.fit(self.slurm, self.alloc.job_id, excluded, self.requested_nodes,
                             user, timeout=left())
        if fit.ok is not False:
            return EXIT_REQUEUED
        try:
            self.slurm.cancel(self.alloc.job_id)
            done = "the requeued job is cancelled"
        except SlurmError as exc:
            done = f"cancelling the requeued job failed: {exc.message}"
        return self.verdict("cannot-fit", EXIT_CANNOT_FIT,
                             f"{exclusions.verdict_message(fit, excluded)}; {done}",
                             fit=fit.as_dict(), excluded=excluded, wanted=why)
