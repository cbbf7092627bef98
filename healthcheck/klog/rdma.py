"""EFA and mlx5 (InfiniBand / RoCE) driver lines, as the drivers print them.

Contract (:func:`parse_rdma`): a kernel message (no framing left) is an RDMA driver event only
when it starts with a driver's device prefix, and then, right after it, with a phrase that
driver prints (``xid_policies/efa.toml``, ``xid_policies/mlx5.toml``) or one of the mlx5
shapes below. Prefixes (the kernel's device printk, ``"%s %s: "`` driver and device name):

* ``efa <bdf>: `` (``dev_err(&pdev->dev, ...)``) and ``efa <bdf> <ibdev>: `` (ib_core's
  ``__ibdev_printk``: ``"%s %s %s: %pV"``, parent driver, parent device, ib device);
* ``infiniband <ibdev>: `` (``dev_err(&ibdev->dev, ...)``: the ib device's class name),
  for the EFA phrases;
* ``mlx5_core <bdf>: `` then the ``"%s:%d:(pid %d): "`` of ``mlx5_core_err`` and friends
  (mlx5_core.h; absent from ``mlx5_core_info`` on newer kernels), and
  ``mlx5_core <bdf> <netdev>: `` (``netdev_info``: en_main.c ``mlx5e_update_carrier``
  prints ``"Link up\\n"`` / ``"Link down\\n"``).

Every match is anchored and bounded (linear in the line). A driver event's own text holds no
user-controlled text before the phrase, so it cannot be forged (property tests:
``tests/healthcheck/test_kernlog_forgery.py``, ``tests/healthcheck/test_ib_driver.py``).

mlx5 severities: ``fatal`` (a ``mlx5.toml`` fatal phrase), ``cmd_noise`` (a routine command
failure, e.g. ``ACCESS_REG``), ``cmd_fail`` (any other command failure), ``link_down`` /
``link_up`` (a port state change), ``module_error`` / ``module`` (events.c ``port_module``:
``"Port module event[error]: module %u, %s, %s\\n"`` / ``"Port module event: module %u,
%s\\n"``: cable plugged, unplugged, or a module error).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from resilient_slurm.config import tomllib

from ..policy import ACTION_RANK, POLICY_DIR, efa_rules

_BDF = r"([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
_EFA = re.compile(r"efa " + _BDF + r"(?: ([\w.-]{1,64}))?: ")
_IB = re.compile(r"infiniband ([\w.-]{1,64}): ")
_MLX5 = re.compile(r"mlx5_core " + _BDF + r"(?: ([^\s/:]{1,15}))?: "
                   r"(?:[A-Za-z_]\w{0,63}:\d{1,6}:\(pid \d{1,10}\): )?")
_MLX5_CMD = re.compile(r"([A-Z][A-Z0-9_]{0,63})\(0x[0-9a-fA-F]{1,4}\) op_mod\(0x[0-9a-fA-F]{1,4}\)"
                       r" failed, status\b")
_LINK = {"Link up": "link_up", "Link down": "link_down"}


@functools.lru_cache(maxsize=1)
def _efa_phrase() -> re.Pattern[str]:
    return re.compile("|".join(re.escape(r.phrase) for r in efa_rules()), re.IGNORECASE)


@dataclass(frozen=True)
class Mlx5Rule:
    phrase: str
    action: str
    meaning: str
    source: str


@functools.lru_cache(maxsize=1)
def _mlx5_data() -> tuple[tuple[Mlx5Rule, ...], frozenset[str]]:
    path = os.path.join(POLICY_DIR, "mlx5.toml")
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    rules = []
    for e in data.get("line", []):
        if e["kind"] != "fatal" or e["action"] not in ACTION_RANK:
            raise ValueError(f"{path}: {e['phrase']!r}: bad kind/action")
        rules.append(Mlx5Rule(e["phrase"], e["action"], e["meaning"], e["source"]))
    noise = frozenset(data.get("command_noise", {}).get("commands", []))
    return tuple(sorted(rules, key=lambda r: -len(r.phrase))), noise


def mlx5_rule_for(text: str) -> Mlx5Rule | None:
    """The fatal rule an mlx5 message's text (after its prefixes) starts with, or None."""
    return next((r for r in _mlx5_data()[0] if text.startswith(r.phrase)), None)


@dataclass(frozen=True)
class RdmaEvent:
    kind: str  # efa | mlx5
    device: str  # efa: the bdf or ib device; mlx5: the bdf, the netdev for a link
    severity: str  # efa: ""; mlx5: see the module docstring
    key: str  # what keeps events of one device apart: phrase, command, module state, bdf


def parse_rdma(msg: str) -> RdmaEvent | None:
    """The EFA / mlx5 event a kernel message stands for, or None (see the module)."""
    if msg.startswith("efa "):
        if (m := _EFA.match(msg)) is not None and (p := _efa_phrase().match(msg, m.end())):
            return RdmaEvent("efa", m.group(1), "", p.group(0).lower())
        return None
    if msg.startswith("infiniband "):
        if (m := _IB.match(msg)) is not None and (p := _efa_phrase().match(msg, m.end())):
            return RdmaEvent("efa", m.group(1), "", p.group(0).lower())
        return None
    if not msg.startswith("mlx5_core ") or (m := _MLX5.match(msg)) is None:
        return None
    bdf, netdev, text = m.group(1).lower(), m.group(2), msg[m.end():].rstrip()
    if netdev:
        state = _LINK.get(text)
        return RdmaEvent("mlx5", netdev, state, bdf) if state else None
    if (rule := mlx5_rule_for(text)) is not None:
        return RdmaEvent("mlx5", bdf, "fatal", rule.phrase)
    if (c := _MLX5_CMD.match(text)) is not None:
        noisy = c.group(1) in _mlx5_data()[1]
        return RdmaEvent("mlx5", bdf, "cmd_noise" if noisy else "cmd_fail", c.group(1))
    if text.startswith("Port module event[error]: "):
        return RdmaEvent("mlx5", bdf, "module_error", text[26:90])
    if text.startswith("Port module event: "):
        return RdmaEvent("mlx5", bdf, "module", text[19:90])
    return None
