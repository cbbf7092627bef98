"""Tiers' contracts that need no process group."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from resilient_slurm.checkpoint import flat, tiers  # noqa: E402


def test_close_at_exit_gives_up_on_a_stuck_save(tmp_path) -> None:
    """A save whose peer exchange never ends (a dead peer) must not hold an exiting process
    back: close(timeout_s) returns False after the timeout instead of waiting forever."""
    t = tiers.Tiers(root=str(tmp_path))
    stop = threading.Event()
    t._thread = threading.Thread(target=stop.wait, daemon=True)  # a writer stuck in a send
    t._thread.start()
    t._last = tiers._Job(1, 1, flat.Stager().stage({"w": torch.ones(2)}))  # never done
    t._ready = True
    t0 = time.monotonic()
    assert t.close(timeout_s=0.6) is False
    assert time.monotonic() - t0 < 3
    stop.set()


def test_bad_options_and_no_process_group_are_said(tmp_path) -> None:
    with pytest.raises(ValueError, match="durable_every needs durable_dir"):
        tiers.Tiers(durable_every=5)
    with pytest.raises(ValueError, match="keep"):
        tiers.Tiers(keep=0)
    with pytest.raises(tiers.CheckpointError, match="init_process_group"):
        tiers.Tiers(root=str(tmp_path)).save({"w": torch.ones(1)}, 1)


def test_root_as_given_and_job_name(tmp_path, monkeypatch) -> None:
    """The node-memory folder is the one given, per node by construction (no placeholder)."""
    monkeypatch.setenv("RESILIENT_NODE", "node7")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("RESILIENT_CKPT_JOB", raising=False)
    t = tiers.Tiers(root=str(tmp_path / "{node}"))
    assert t.job_dir == str(tmp_path / "{node}" / "4242")
    monkeypatch.setenv("SLURM_JOB_ID", "../etc")  # not a plain name: never a path
    assert tiers.default_job() != "../etc"


def test_the_gloo_interface_is_chosen_and_checked() -> None:
    """The tiers' gloo group uses the interface that routes to MASTER_ADDR, or the one
    GLOO_SOCKET_IFNAME names, which must exist (a clear error, not gloo's own failure)."""
    from resilient_slurm.checkpoint import peers

    name, why = peers.gloo_interface({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert name == "lo" and "routes to MASTER_ADDR 127.0.0.1" in why
    assert peers.gloo_interface({"GLOO_SOCKET_IFNAME": "lo"}) == ("lo", "GLOO_SOCKET_IFNAME")
    with pytest.raises(ValueError, match="GLOO_SOCKET_IFNAME=nosuch0: no interface nosuch0"):
        peers.gloo_interface({"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert peers.gloo_interface({})[0] is None


def test_the_copy_runs_off_the_training_path_and_the_next_step_waits_for_it(tmp_path) -> None:
    """With the side copy a save lays out the buffer and returns; the copy of the state runs
    in the writer thread (CPU; a side stream on CUDA), and the next optimizer step (any
    optimizer: torch's global step pre-hook) waits for it, so the snapshot holds the state as
    it was at the save, never a half-updated one."""
    w = torch.nn.Parameter(torch.ones(256, 256))
    opt = torch.optim.SGD([w], lr=1.0)
    w.grad = torch.ones_like(w)
    staged = flat.Stager().stage({"w": w}, defer=True)
    assert staged.pending is not None  # laid out, not copied yet
    t = tiers.Tiers(root=str(tmp_path))
    job = tiers._Job(1, 1, staged)
    t._last = job

    def writer() -> None:
        time.sleep(0.5)
        staged.finish_copy()
        job.copied.set()

    t._thread = threading.Thread(target=writer, daemon=True)
    t._thread.start()
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    hook = register_optimizer_step_pre_hook(t._before_step)
    try:
        t0 = time.monotonic()
        opt.step()  # held until the copy is done
        assert time.monotonic() - t0 >= 0.3
    finally:
        hook.remove()
    assert torch.equal(flat.unpack(b"".join(bytes(p) for p in staged.parts()))["w"],
                       torch.ones(256, 256))  # the state at the save, not after the step
    assert torch.equal(w.detach(), torch.zeros(256, 256))
    assert t.timings.copy_wait_total > 0.3


def test_host_buffers_are_exactly_the_size_asked() -> None:
    from resilient_slurm.checkpoint import pinned

    n = 13 * 2**20 + 12345
    assert pinned.host_buffer(n, pin=False).numel() == n
    if torch.cuda.is_available():  # the GPU proof runs this: registered, not rounded up
        buf = pinned.host_buffer(n, pin=True)
        assert buf.numel() == n and buf.is_pinned()
