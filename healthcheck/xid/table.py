"""The Xid table of docs/health.md, generated from the policy data files.

``python -m resilient_slurm.healthcheck.xid.table`` prints it; ``--write`` replaces the table
between the markers in ``docs/health.md``; ``--check`` exits 1 when the doc differs (the test
suite runs the same comparison, so the doc cannot drift from the data). Every row shows the
catalog's own columns next to the action each generation's map takes, so a reviewer can diff
it against NVIDIA's catalog.
"""

from __future__ import annotations

import argparse
import os
import sys

from resilient_slurm.healthcheck.config import GPU_GENERATIONS, HealthConfig

from ..policy import catalog, load_policy, unused_codes
from .decode import nvlink5_rows

BEGIN = ("<!-- xid-table:begin (generated: python -m resilient_slurm.healthcheck.xid.table "
         "--write) -->")
END = "<!-- xid-table:end -->"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
DOC = os.path.join(_REPO, "docs", "health.md")


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def render() -> str:
    """The generated Markdown (both tables and the unused-code line), without markers."""
    cfg = HealthConfig()  # the shipped maps, without a site's overrides
    policies = [load_policy(g, cfg) for g in GPU_GENERATIONS]
    head = ("| Xid | mnemonic | catalog applies A100/H100/B100/GB200 | catalog immediate action | "
            + " | ".join(f"{p.generation} ({'+'.join(p.columns)})" for p in policies) + " |")
    lines = [head, "|" + "---|" * (4 + len(policies))]
    for code, e in sorted(catalog().items()):
        flags = "/".join("Y" if c in e.applies else "N" for c in ("A100", "H100", "B100", "GB200"))
        cells = []
        for p in policies:
            r = p.rule(code)
            cells.append("unknown" if not r.mapped else (
                f"{r.action}, ignorable bits: ignore" if r.decode == "74" else
                f"decode {r.decode}" if r.decode else r.action))
        immediate = e.immediate if not e.immediate.startswith("(prose)") else (
            "prose: " + e.immediate[len("(prose) "):])
        lines.append(f"| {code} | {_cell(e.mnemonic)} | {flags} | {_cell(immediate) or '(none)'} | "
                     + " | ".join(cells) + " |")
    unused = unused_codes()
    lines += ["", "Marked *Unused* by the catalog (no column, CONTACT_SUPPORT), `unknown` on every "
              "generation: " + ", ".join(map(str, unused)) + ". Any code above 172 is not in "
              "the catalog: `unknown` too.", "",
              "NVLink5 decode (catalog sheet *XID 144-150 Decode*; `xid_policies/nvlink5.toml`):",
              "", "| Xid | subcode | error status / link-down reason | catalog immediate action "
              "| severity | action |", "|---|---|---|---|---|---|"]
    acts = {"IGNORE": "ignore", "RESET_GPU": "reset_gpu", "XID_154_EVAL": "restart_app"}
    for row in nvlink5_rows():
        key = ("status " + ", ".join(f"0x{v:x}" for v in row.status) if row.status is not None
               else "reason " + ", ".join(map(str, row.reason)) if row.reason is not None
               else "any")
        bucket = row.immediate + (f" (Fatal line: {row.promoted})" if row.promoted else "")
        action = acts[row.immediate] + (f" (Fatal line: {acts[row.promoted]})"
                                        if row.promoted else "")
        lines.append(f"| {row.xid} | {' / '.join(row.subcodes)} | {key} | {bucket} | "
                     f"{row.severity} | {action} |")
    return "\n".join(lines) + "\n"


def replace_in(doc: str, table: str) -> str:
    """``doc`` with the text between the markers replaced by ``table``."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"the doc has no {BEGIN!r} ... {END!r} markers")
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{table}{END}{after}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m resilient_slurm.healthcheck.xid.table",
                                 description="Print the Xid table generated from the policy "
                                 "data, or write / check it in docs/health.md.")
    ap.add_argument("--doc", default=DOC, help="the Markdown file holding the markers "
                    "(default: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the table in --doc")
    mode.add_argument("--check", action="store_true", help="exit 1 if --doc's table differs")
    args = ap.parse_args(argv)
    table = render()
    if not (args.write or args.check):
        sys.stdout.write(table)
        return 0
    try:
        with open(args.doc, encoding="utf-8") as fh:
            doc = fh.read()
        new = replace_in(doc, table)
    except (OSError, ValueError) as exc:
        print(f"xid.table: {args.doc}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != doc:
            print(f"xid.table: {args.doc}: the Xid table differs from the policy data; run "
                  "with --write", file=sys.stderr)
            return 1
        return 0
    with open(args.doc + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(new)
    os.replace(args.doc + ".tmp", args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
