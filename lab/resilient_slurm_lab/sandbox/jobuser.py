"""The sandbox's unprivileged job account: jobs run as an ordinary user, as on a real cluster.

``up`` makes sure the account exists (``useradd`` when missing; it is left in place by ``down``,
like any login on a cluster) and gives it a work directory in the sandbox with ``checkpoints/``
and ``state/`` it owns. :func:`run_as` and ``resilient-slurm sandbox exec-as-user`` run a
command as that user with a clean environment holding what a job on the sandbox needs
(:func:`job_env`, which ``resilient-slurm sandbox env`` prints).
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from resilient_slurm.fsutil import atomic_write
from resilient_slurm_lab.sandbox.cluster import Paths, SandboxError, read_meta

DEFAULT_USER = "rsjob"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class JobUser:
    """The account jobs run as in one sandbox, and the directories it owns there."""

    name: str
    uid: int
    gid: int
    home: str
    work_dir: str  # <sandbox>/users/<name>: the user's directory in this sandbox (0700)
    checkpoint_dir: str  # <work_dir>/checkpoints
    state_dir: str  # <work_dir>/state

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ensure_account(name: str = DEFAULT_USER, attempts: int = 20) -> pwd.struct_passwd:
    """The passwd entry for ``name``, creating an ordinary account (``useradd -m``) if missing.

    Several sandboxes may start at once: a concurrent ``useradd`` (exit 9, name taken) counts as
    success, a locked passwd file (exit 10) is retried.
    """
    if not name or name == "root" or not name.replace("-", "").replace("_", "").isalnum():
        raise SandboxError(f"--user {name!r}: give the name of an ordinary (non-root) account")
    for _ in range(attempts):
        try:
            entry = pwd.getpwnam(name)
            break
        except KeyError:
            pass
        out = subprocess.run(  # noqa: S603 - argv list
            ["useradd", "--create-home", "--user-group", "--shell", "/bin/bash",
             "--comment", "resilient-slurm sandbox job user", name],
            capture_output=True, text=True, timeout=30,
        )
        if out.returncode not in (0, 9, 10):
            raise SandboxError(f"useradd {name} failed: {out.stderr.strip() or out.returncode}")
        if out.returncode == 10:
            time.sleep(0.5)
    else:
        raise SandboxError(f"could not create the account {name} (passwd file stayed locked)")
    if entry.pw_uid == 0:
        raise SandboxError(f"--user {name}: has uid 0; jobs must run as an unprivileged account")
    return entry


def unreachable_by(path: str, uid: int, gid: int) -> str | None:
    """The first directory above or at ``path`` that ``uid`` cannot traverse (None: all fine)."""
    current = os.path.abspath(path)
    chain = []
    while True:
        chain.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(chain):
        st = os.stat(directory)
        if st.st_uid == uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return directory
    return None


def make_user_dir(path: str, user: JobUser | pwd.struct_passwd, mode: int = 0o700) -> str:
    """Create ``path`` (and missing parents, root-owned 0755) owned by ``user``; returns it."""
    uid = user.uid if isinstance(user, JobUser) else user.pw_uid
    gid = user.gid if isinstance(user, JobUser) else user.pw_gid
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.makedirs(path, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    blocked = unreachable_by(path, uid, gid)
    if blocked is not None:
        mode_now = stat.S_IMODE(os.stat(blocked).st_mode)
        raise SandboxError(f"{blocked} is mode {mode_now:o}: uid {uid} cannot reach {path} "
                           f"(chmod o+x {blocked}, or choose a directory others may traverse)")
    return path


def prepare(paths: Paths, name: str = DEFAULT_USER) -> JobUser:
    """Make sure the account exists and owns its directories in this sandbox."""
    entry = ensure_account(name)
    work = paths.p("users", name)
    os.makedirs(paths.p("users"), mode=0o755, exist_ok=True)
    os.chmod(paths.p("users"), 0o755)
    user = JobUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir,
                   work_dir=work, checkpoint_dir=os.path.join(work, "checkpoints"),
                   state_dir=os.path.join(work, "state"))
    make_user_dir(work, user)
    make_user_dir(user.checkpoint_dir, user)
    make_user_dir(user.state_dir, user)
    return user


def job_user(root: str) -> JobUser:
    """The job user recorded for the sandbox under ``root``."""
    paths = Paths(root)
    data = read_meta(paths).get("user")
    if not isinstance(data, dict):
        raise SandboxError(f"the sandbox at {paths.root} records no job user (started by an "
                           "older version: `down` and `up` it again)")
    return JobUser(**data)


NODE_MEMORY = "shm"  # each node's memory-tier folder, under its node directory
TIER1_TEMPLATE = "RESILIENT_SANDBOX_TIER1_DIR"  # RESILIENT_TIER1_DIR with {node}, per task
# Slurm reads a TaskProlog's `export NAME=value` lines into the task's environment.
TASK_PROLOG = f"""#!/bin/sh
# The sandbox's TaskProlog (resilient_slurm_lab.sandbox.jobuser): this task's node memory.
[ -n "${{{TIER1_TEMPLATE}:-}}" ] || exit 0
printf 'export RESILIENT_TIER1_DIR=%s\\n' \\
    "$(printf '%s' "${TIER1_TEMPLATE}" | sed "s/{{node}}/$SLURMD_NODENAME/g")"
"""


def jobs_metrics_dir(paths: Paths) -> str:
    """The jobs' textfile directory of ``sandbox up --metrics`` (``metrics_stack.py``)."""
    return paths.p("metrics", "jobs")


def jobs_index(paths: Paths) -> str:
    """The jobs index (``resilient-launch --job-index``, the config's ``[fleet] jobs_index``)."""
    return paths.p("metrics", "jobs", "index.jsonl")


def job_env(paths: Paths) -> dict[str, str]:
    """What a job on this sandbox needs in its environment (sbatch passes the submitter's on):
    ``SLURM_CONF``; ``RESILIENT_SANDBOX_DIR`` (node faults); ``RESILIENT_SLURM_CONFIG``, the
    hooks' config, where resilient-launch reads where verdicts are published; and
    ``RESILIENT_SANDBOX_TIER1_DIR`` (:data:`TIER1_TEMPLATE`), each node's memory folder with
    ``{node}`` for its name: the nodes share this host's ``/dev/shm``, a real node has memory of
    its own, so the sandbox's TaskProlog (:func:`make_node_memory`) gives every task
    ``RESILIENT_TIER1_DIR``, that path for its node. With ``up --metrics``, also
    ``RESILIENT_METRICS_DIR`` and ``RESILIENT_JOB_INDEX`` (the job's metrics and the index)."""
    env = {
        "SLURM_CONF": paths.conf,
        "RESILIENT_SANDBOX_DIR": paths.root,
        "RESILIENT_SLURM_CONFIG": paths.p("etc", "resilient-slurm", "config.toml"),
        TIER1_TEMPLATE: paths.p("nodes", "{node}", NODE_MEMORY),
    }
    if os.path.isdir(jobs_metrics_dir(paths)):
        env["RESILIENT_METRICS_DIR"] = jobs_metrics_dir(paths)
        env["RESILIENT_JOB_INDEX"] = jobs_index(paths)
    return env


def make_node_memory(paths: Paths, nodes: Sequence[str]) -> list[str]:
    """Each node's memory-tier folder (:func:`job_env`), sticky and open to all, as
    ``/dev/shm`` is (the epilog removes a finished job's folder in it), and the TaskProlog that
    gives every task its node's folder: with :data:`TIER1_TEMPLATE` set, ``RESILIENT_TIER1_DIR``
    is that path with ``{node}`` replaced by the task's node (a template no node's task
    changes, so a step's tasks on other nodes get theirs). Returns its slurm.conf line."""
    for node in nodes:
        path = os.path.join(paths.node_dir(node), NODE_MEMORY)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o1777)
    os.makedirs(paths.p("bin"), mode=0o755, exist_ok=True)
    prolog = paths.p("bin", "task-prolog")
    atomic_write(prolog, TASK_PROLOG, mode=0o755)
    return [f"TaskProlog={prolog}"]


def user_env(paths: Paths, user: JobUser, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean login-like environment for ``user`` pointing at this sandbox (:func:`job_env`).

    PATH holds the running Python's ``bin`` directory (the project's venv) first, then the
    system's, so ``resilient-launch`` and ``sbatch`` are both found.
    """
    env = {
        "PATH": os.path.dirname(sys.executable) + ":" + USER_PATH,
        "HOME": user.home,
        "USER": user.name,
        "LOGNAME": user.name,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        **job_env(paths),
    }
    env.update(extra or {})
    return env


def run_as(
    root: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the sandbox's job user (``env`` adds to its clean environment).

    ``cwd`` defaults to the user's work directory in the sandbox; other keyword arguments go to
    :func:`subprocess.run` (``text=True`` is the default).
    """
    paths = Paths(root)
    user = job_user(root)
    kwargs.setdefault("text", True)
    return subprocess.run(  # noqa: S603 - argv list
        list(argv),
        env=user_env(paths, user, env),
        cwd=cwd or user.work_dir,
        user=user.uid,
        group=user.gid,
        extra_groups=os.getgrouplist(user.name, user.gid),
        **kwargs,
    )


def exec_as(root: str, argv: Sequence[str], cwd: str | None = None) -> None:
    """Replace this process by ``argv`` running as the job user (the CLI's ``exec-as-user``).

    Stays in the current directory when the user may enter it, else goes to the user's work
    directory (a job's output lands in its submit directory).
    """
    import shutil

    paths = Paths(root)
    user = job_user(root)
    env = user_env(paths, user)
    exe = shutil.which(argv[0], path=env["PATH"]) if "/" not in argv[0] else argv[0]
    if exe is None:
        raise SandboxError(f"{argv[0]}: not found on the job user's PATH ({env['PATH']})")
    target = cwd or os.getcwd()
    os.setgroups(os.getgrouplist(user.name, user.gid))
    os.setgid(user.gid)
    os.setuid(user.uid)
    try:
        os.chdir(target)
    except OSError:
        if cwd is not None:
            raise SandboxError(f"{user.name} cannot enter {cwd}") from None
        os.chdir(user.work_dir)
    os.execve(exe, list(argv), env)
