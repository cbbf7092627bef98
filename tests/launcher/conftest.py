"""Fixtures shared by the launcher's cluster tests (helpers: ``launch_helpers.py``)."""

from __future__ import annotations

import pytest

from tests.conftest import make_healthy_idle


def _healthy_idle(sbx, job_user):
    from resilient_slurm.slurm import connect

    s = connect(conf=sbx.conf, backend="cli", timeout=20)
    make_healthy_idle(sbx, s, 60)
    return sbx, s, job_user


@pytest.fixture()
def prod(prod_sandbox, job_user):
    """(sandbox, root's Slurm handle, job user), every node healthy and idle."""
    return _healthy_idle(prod_sandbox, job_user)


@pytest.fixture()
def prod6(prod6_sandbox, job_user):
    """As ``prod``, on the 6-node production sandbox."""
    return _healthy_idle(prod6_sandbox, job_user)
