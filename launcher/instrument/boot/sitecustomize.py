"""resilient-launch's bootstrap (``resilient_slurm.launcher.instrument``): instruments a
training rank's optimizer steps, then runs the user's own ``sitecustomize`` if there is one.
Never raises: an error is printed once and the process runs uninstrumented."""

try:
    from resilient_slurm.launcher.instrument import bootstrap as _rs_bootstrap
except Exception as _rs_exc:  # noqa: BLE001 - the bootstrap must never break a script
    import sys as _rs_sys

    print(f"resilient-launch instrument: off ({type(_rs_exc).__name__}: {_rs_exc})",
          file=_rs_sys.stderr, flush=True)
else:
    _rs_bootstrap.start(__file__)
