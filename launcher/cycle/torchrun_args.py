"""A ``torchrun`` command line, read the way torchrun reads it, split for ``resilient-launch``.

``resilient-launch`` replaces ``torchrun`` in a batch script, so it is given torchrun's whole
option set (torch 2.13's ``torch.distributed.run``, both spellings: ``--nproc-per-node`` and
``--nproc_per_node``, ``--flag=value`` and ``--flag value``). :func:`split` sorts each option
before the script into one of:

* **ours** (``resilient-launch``'s own options, ``--nproc-per-node``, ``-m``,
  ``--max-restarts`` and ``--term-timeout`` among them): left for click to parse;
* **owned** by the launcher (``--nnodes``, ``--rdzv-*``, ``--standalone``, ``--node-rank``,
  ``--master-*``, ``--local-addr``): consumed, with a one-line note of what the launcher uses
  instead (``--nnodes MIN:MAX`` becomes ``--min-nodes MIN`` unless ``--min-nodes`` is given);
* **passed on** to ``ft_launcher`` exactly once, verbatim (torchrun's ``--log-dir``,
  ``--redirects``, ``--tee``, ``--no-python``, ``--local-ranks-filter``... and ft_launcher's own
  ``--ft-*`` flags, ``--ignore-missing-fault-tol-cfg``, ``--workers-stop-timeout``);
* anything else: :class:`UsageError` naming the flag (exit 2).

The first argument that is not an option (or the one after ``--``) is the script; it and
everything after it are the script's, untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class UsageError(ValueError):
    """A flag neither torchrun, ft_launcher nor resilient-launch knows, or one missing its
    value."""


# torchrun options the launcher decides itself: canonical name -> takes a value.
OWNED: dict[str, bool] = {
    "--nnodes": True, "--rdzv-backend": True, "--rdzv-endpoint": True, "--rdzv-id": True,
    "--rdzv-conf": True, "--standalone": False, "--node-rank": True, "--master-addr": True,
    "--master-port": True, "--local-addr": True,
}
# torchrun options passed on to ft_launcher as given: canonical name -> takes a value.
PASSED: dict[str, bool] = {
    "--monitor-interval": True, "--start-method": True, "--event-log-handler": True,
    "--role": True, "--no-python": False, "--run-path": False, "--log-dir": True,
    "--redirects": True, "--tee": True, "--local-ranks-filter": True,
    "--duplicate-stdout-filters": True, "--duplicate-stderr-filters": True,
    "--logs-specs": True, "--numa-binding": True, "--signals-to-handle": True,
    "--shutdown-timeout": True, "--virtual-local-rank": False,
    # ft_launcher's own, beyond torchrun's
    "--workers-stop-timeout": True, "--ignore-missing-fault-tol-cfg": False,
    "--fault-tol-cfg-path": True, "--restart-policy": True,
}
SHORT = {"-r": "--redirects", "-t": "--tee"}
# Every ``--ft-*`` flag of NVRx 0.4.1-0.7 takes a value (checked in their argparse sources).
FT_PREFIX = "--ft-"


def canonical(flag: str) -> str:
    """``--nproc_per_node`` -> ``--nproc-per-node`` (torchrun accepts both)."""
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else SHORT.get(flag, flag)


@dataclass
class Split:
    """What :func:`split` made of a command line."""

    ours: list[str] = field(default_factory=list)  # for click, script and its args last
    passed: list[str] = field(default_factory=list)  # to ft_launcher, each once
    owned: dict[str, str | None] = field(default_factory=dict)  # canonical -> value given
    notes: list[str] = field(default_factory=list)
    script: str | None = None
    script_args: list[str] = field(default_factory=list)


def split(argv: Sequence[str], ours: Mapping[str, bool]) -> Split:
    """Sort ``argv`` (the options, then the script and its args). ``ours``: each of
    resilient-launch's own option spellings -> whether it takes a value."""
    out = Split()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            rest = argv[i + 1:] if arg == "--" else argv[i:]
            if rest:
                out.script, out.script_args = rest[0], list(rest[1:])
            break
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        canon = canonical(name)
        key = name if name in ours else canon if canon in ours else None
        if key is not None:
            takes = ours[key]
        elif canon in OWNED:
            takes = OWNED[canon]
        elif canon in PASSED:
            takes = PASSED[canon]
        elif canon.startswith(FT_PREFIX) and len(canon) > len(FT_PREFIX):
            takes = True
        else:
            raise UsageError(f"unknown option {name} (not a torchrun, ft_launcher or "
                             "resilient-launch option; see resilient-launch --help)")
        if eq and not takes:
            raise UsageError(f"option {name} takes no value")
        if takes and not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"option {name} needs a value")
            value = argv[i + 1]
            i += 1
        i += 1
        if key is not None:
            out.ours.append(f"{key}={value}" if takes else key)
        elif canon in OWNED:
            out.owned[canon] = value if takes else None
        else:  # verbatim (NVRx knows its spellings), a short one in its long form
            flag = canon if name in SHORT else name
            out.passed.append(f"{flag}={value}" if takes else flag)
    _notes(out)
    if out.script is not None:
        out.ours += ["--", out.script, *out.script_args]
    return out


def _notes(out: Split) -> None:
    owned = out.owned
    nn = owned.get("--nnodes")
    if nn is not None:
        lo, colon, _hi = nn.partition(":")
        if colon and not any(a.split("=", 1)[0] == "--min-nodes" for a in out.ours):
            if not lo.isdigit() or int(lo) < 1:
                raise UsageError(f"--nnodes {nn}: MIN must be a positive integer")
            out.ours.append(f"--min-nodes={int(lo)}")
            out.notes.append(f"--nnodes {nn}: training on the allocation's nodes, "
                             f"--min-nodes {int(lo)} used instead")
        else:
            out.notes.append(f"--nnodes {nn}: training on the allocation's nodes (shrinking "
                             "to --min-nodes after a node fault)")
    rdzv = [f for f in ("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
                        "--standalone", "--master-addr", "--master-port") if f in owned]
    if rdzv:
        out.notes.append(f"{', '.join(rdzv)}: the launcher's own rendezvous used instead (c10d "
                         "on the first node, fresh endpoint and id each cycle)")
    if "--node-rank" in owned:
        out.notes.append("--node-rank: each node's rank comes from the rendezvous")
    if "--local-addr" in owned:
        out.notes.append("--local-addr: each node's own address (from Slurm) used instead")
