"""Slurm hostlist expressions: ``node[1-3,7]`` <-> ``["node1", "node2", "node3", "node7"]``.

Pure Python, no Slurm needed (the hooks must not shell out just to read a node list).
Supports several comma-separated terms, several bracket groups per term (cartesian product,
as Slurm does), and zero padding (``gpu[08-10]`` keeps the width).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable


class HostlistError(ValueError):
    """A hostlist expression that cannot be parsed."""


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRAILING_NUM = re.compile(r"^(.*?)(\d+)$")
MAX_HOSTS = 1_000_000


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    terms: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    terms.append("".join(cur))
    return [t.strip() for t in terms if t.strip()]


def _expand_ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise HostlistError(f"bad range {part!r} in {expr!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"descending range {part!r} in {expr!r}")
        if hi - lo >= MAX_HOSTS:
            raise HostlistError(f"range {part!r} too large in {expr!r}")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression into host names, in Slurm's order."""
    if not isinstance(expr, str):
        raise HostlistError("hostlist must be a string")
    hosts: list[str] = []
    for term in _split_top(expr):
        pieces: list[list[str]] = []
        pos = 0
        for m in re.finditer(r"\[([^\]]*)\]", term):
            pieces.append([term[pos : m.start()]])
            pieces.append(_expand_ranges(m.group(1), expr))
            pos = m.end()
        pieces.append([term[pos:]])
        for combo in itertools.product(*pieces):
            name = "".join(combo)
            if not name or any(c in name for c in "[], \t\n"):
                raise HostlistError(f"bad host name {name!r} in {expr!r}")
            hosts.append(name)
            if len(hosts) > MAX_HOSTS:
                raise HostlistError(f"{expr!r} expands to too many hosts")
    return hosts


def _split_num(name: str) -> tuple[str, str] | None:
    m = _TRAILING_NUM.match(name)
    return (m.group(1), m.group(2)) if m else None


def _ranges(nums: list[int], width: int) -> list[str]:
    out: list[str] = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        a, b = str(start).zfill(width), str(prev).zfill(width)
        out.append(a if start == prev else f"{a}-{b}")
        if n is not None:
            start = prev = n
    return out


def compress(hosts: Iterable[str]) -> str:
    """The bracket form of ``hosts``: duplicates dropped, numbers sorted within each prefix.

    ``expand(compress(hosts))`` holds exactly the distinct names of ``hosts``. Zero-padded
    numbers keep their width (``gpu09`` + ``gpu10`` -> ``gpu[09-10]``).
    """
    order: list[str] = []  # prefixes (and plain names) in first-seen order
    padded: dict[str, dict[int, set[int]]] = {}  # prefix -> width -> numbers
    unpadded: dict[str, set[int]] = {}
    plain: set[str] = set()
    for name in hosts:
        if not name or any(c in name for c in "[], \t\n"):
            raise HostlistError(f"bad host name {name!r}")
        split = _split_num(name)
        if split is None:
            if name not in plain:
                plain.add(name)
                order.append("\0" + name)
            continue
        prefix, digits = split
        if prefix not in padded:
            padded[prefix], unpadded[prefix] = {}, set()
            order.append(prefix)
        if digits.startswith("0") and len(digits) > 1:
            padded[prefix].setdefault(len(digits), set()).add(int(digits))
        else:
            unpadded[prefix].add(int(digits))
    terms: list[str] = []
    for item in order:
        if item.startswith("\0"):
            terms.append(item[1:])
            continue
        groups = {w: set(ns) for w, ns in padded[item].items()}
        for n in unpadded[item]:
            # An unpadded number joins the widest padded group it already fills.
            fits = [w for w in groups if w <= len(str(n))]
            groups.setdefault(max(fits) if fits else 0, set()).add(n)
        for width in sorted(groups):
            nums = sorted(groups[width])
            rng = _ranges(nums, width)
            terms.append(f"{item}{rng[0]}" if len(nums) == 1 else f"{item}[{','.join(rng)}]")
    return ",".join(terms)
