"""The docs stay true to the repository: every relative link resolves (file, and heading anchor
when one is named), every repository path named in code exists, and every command-line flag
written after one of our commands exists in that command's ``--help``. No Slurm needed: the
commands' help is produced in-process."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
                    *(ROOT / "healthcheck").rglob("*.md"), *(ROOT / "training").rglob("*.md"),
                    ROOT / "lab" / "README.md",
                    *(ROOT / "lab" / "resilient_slurm_lab").rglob("*.md")])

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
SPAN = re.compile(r"(`+)(.+?)\1")
COMMANDS = ("resilient-slurm", "resilient-health", "resilient-launch", "resilient-prolog",
            "resilient-epilog")
README_LIMIT = 10_000  # bytes: "under 10 KB"
SEGMENT_END = {"|", "||", "&&", ";", "#", ">", ">>", "2>&1", "<", "\\"}


# --- reading Markdown -----------------------------------------------------------------------

def _strip_code(text: str) -> str:
    """Text without fenced blocks and inline code (links inside code are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(SPAN.sub("", line))
    return "\n".join(out)


def code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, code) for every line of a fenced block (continuations joined) and every
    inline code span."""
    fenced, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield start, pending + line
            pending = ""
        else:
            for match in SPAN.finditer(line):
                yield number, match.group(2)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            base = slug(line.lstrip("#"))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in LINK.findall(_strip_code(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.relative_to(ROOT)}: link to missing {target}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.relative_to(ROOT)}: link to missing heading {target}")
    return problems


def missing_paths(path: Path) -> list[str]:
    """Repository paths named in code spans (``launcher/cycle/plan.py``, ``bench/run_all.py``):
    those that start with one of the repository's folders must exist."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in re.finditer(r"`([^`\s]+)`", line):
            name = match.group(1).split("::")[0].rstrip(".,:;")  # a pytest id names its file
            if re.search(r"[<>$\[\]|]", name):  # a placeholder: written at run time
                continue
            pattern = re.search(r"[{}*]", name)
            if pattern:  # a pattern (`policy/{ampere,ada}.toml`): its fixed folder must exist
                name = name[:pattern.start()].rpartition("/")[0]
            if "/" not in name:
                continue
            if name.split("/")[0] in tops and not (ROOT / name).exists():
                problems.append(f"{path.relative_to(ROOT)}:{number}: no such path {name}")
    return problems


# --- our commands' help ---------------------------------------------------------------------

def _click_main(name: str) -> click.Command:
    if name == "resilient-slurm":
        from resilient_slurm.cli import main
    elif name == "resilient-health":
        from resilient_slurm.hooks.health_cli import main
    else:
        from resilient_slurm.launcher.cli import main
    return main


def _argparse_help(name: str) -> str:
    entry: Callable[[list[str]], int]
    if name == "resilient-prolog":
        from resilient_slurm.prolog.hook import prolog_main as entry
    else:
        from resilient_slurm.epilog.hook import epilog_main as entry
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        entry(["--help"])
    return out.getvalue()


_HELP: dict[tuple[str, ...], str] = {}


def help_text(path: tuple[str, ...]) -> str:
    """``--help`` of ``path`` (the command, then subcommands), produced in-process."""
    if path not in _HELP:
        if path[0] in ("resilient-prolog", "resilient-epilog"):
            _HELP[path] = _argparse_help(path[0])
        else:
            result = CliRunner().invoke(_click_main(path[0]), [*path[1:], "--help"],
                                        prog_name=path[0])
            assert result.exit_code == 0, f"{' '.join(path)} --help: {result.output}"
            _HELP[path] = result.output
    return _HELP[path]


@dataclass
class FlagUse:
    command: tuple[str, ...]
    flag: str


def _tokens(code: str) -> list[str]:
    """Shell-ish words; quotes, parentheses and backticks separate words, so a command inside
    ``"$(...)"`` is seen too."""
    return re.findall(r"[^\s\"'()`;]+|;", code)


def flag_uses(code: str) -> Iterator[FlagUse]:
    """Each ``--flag`` written after one of our commands in ``code`` (one shell line)."""
    tokens = _tokens(code)
    for i, token in enumerate(tokens):
        if token not in COMMANDS:
            continue
        yield from _flags_after(token, tokens[i + 1:])


def _flags_after(name: str, rest: list[str]) -> Iterator[FlagUse]:
    path: tuple[str, ...] = (name,)
    command: click.Command | None = None if name in ("resilient-prolog", "resilient-epilog") \
        else _click_main(name)
    skip_value = False
    for raw in rest:
        token = raw.strip("[](),;:")  # prose punctuation around a flag
        if raw in SEGMENT_END or raw.startswith("#") or raw == "--":
            return
        if skip_value:
            skip_value = False
            continue
        if token.startswith("--") and len(token) > 2:
            flag = token.split("=", 1)[0]
            yield FlagUse(path, flag)
            if command is not None and "=" not in token:
                param = next((p for p in command.params if isinstance(p, click.Option)
                              and flag in p.opts + p.secondary_opts), None)
                skip_value = param is not None and not param.is_flag and param.nargs != 0
            continue
        if token.startswith("-") or not token:
            continue
        if isinstance(command, click.Group) and token in command.commands:
            command = command.commands[token]
            path = (*path, token)
            continue
        if command is not None and any(isinstance(p, click.Argument) and p.nargs == -1
                                       for p in command.params):
            return  # a script and its own arguments follow (resilient-launch train.py --lr ...)


def _resolve(path: tuple[str, ...]) -> click.Command | None:
    if path[0] in ("resilient-prolog", "resilient-epilog"):
        return None
    command = _click_main(path[0])
    for name in path[1:]:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def has_flag(path: tuple[str, ...], flag: str) -> bool:
    """``flag`` is an option of that command, listed in its ``--help`` (for click commands:
    one of its declared options, not a word of the help's prose)."""
    text = help_text(path)
    if flag == "--help":
        return "--help" in text
    command = _resolve(path)
    if command is not None:
        declared = {o for p in command.params if isinstance(p, click.Option) and not p.hidden
                    for o in (*p.opts, *p.secondary_opts)}
        if flag not in declared:
            return False
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def unknown_flags(path: Path) -> list[str]:
    problems = []
    for number, code in code_lines(path.read_text(encoding="utf-8")):
        for use in flag_uses(code):
            if not has_flag(use.command, use.flag):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {' '.join(use.command)} "
                                f"has no {use.flag} in its --help")
    return problems


# --- the tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(doc: Path) -> None:
    assert missing_paths(doc) == []


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_flags_exist_in_help(doc: Path) -> None:
    assert unknown_flags(doc) == []


def test_readme_stays_under_10_kb() -> None:
    """README.md is the first page (what it is, install, the two commands, a quick start per
    role, links into docs/); reference detail lives in docs/, so the README stays short."""
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit " \
        f"{README_LIMIT})"


HISTORY = re.compile(r"\bissue \d+|^\|.*\|\s*before(?:\s*\([^)|]*\))?\s*\|\s*after\s*\|.*$",
                     re.IGNORECASE | re.MULTILINE)
DECISIONS = ROOT / "docs" / "decisions"


def history(text: str) -> list[str]:
    """What in ``text`` tells the project's history instead of how things are: a reference to
    an issue, a before/after table."""
    return [m.group(0) for m in HISTORY.finditer(text)]


@pytest.mark.parametrize("doc", [d for d in DOC_FILES if DECISIONS not in d.parents],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_state_how_things_are(doc: Path) -> None:
    """Why the code has its shape, and what it was before, belongs in docs/decisions/."""
    assert history(doc.read_text(encoding="utf-8")) == []


def test_history_check_sees_a_before_after_table_and_an_issue() -> None:
    text = "| | before (issue 27) | after |\n|---|---|---|\nSplit in Issue 12: x.\n"
    assert history(text) == ["| | before (issue 27) | after |", "Issue 12"]
    assert history("| run | steps/s before (2-10) | after exclusion |\nissues\n") == []


def test_decision_records_have_their_parts_and_are_listed() -> None:
    """Each record is short ADR form (context, decision, consequences) and listed in the index."""
    records = sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
    index = (DECISIONS / "README.md").read_text(encoding="utf-8")
    assert records
    for record in records:
        headings = [x for x in record.read_text(encoding="utf-8").splitlines()
                    if x.startswith("## ")]
        assert headings == ["## Context", "## Decision", "## Consequences"], record.name
        assert f"]({record.name})" in index, record.name


def test_docs_name_flags_of_every_command() -> None:
    """The flag test is not vacuous: the docs name flags of each of our commands."""
    seen = {use.command[0] for doc in DOC_FILES
            for _n, code in code_lines(doc.read_text(encoding="utf-8"))
            for use in flag_uses(code)}
    assert {"resilient-slurm", "resilient-health", "resilient-launch"} <= seen


def test_checker_finds_planted_mistakes(tmp_path: Path) -> None:
    """A bad link, a bad anchor, a flag no command has and a missing path are each reported."""
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "page.md"
    (docs / "other.md").write_text("# A heading\n", encoding="utf-8")
    page.write_text(
        "See [gone](missing.md), [ok](other.md#a-heading), [bad](other.md#nope).\n\n"
        "```sh\nresilient-health check --simulate xid79 --no-such-flag\n"
        "resilient-launch --max-restarts 3 train.py --lr 3e-4\n```\n\n"
        "Run `resilient-slurm sandbox up --nodes 4 --bogus`.\n\n"
        "Code in `launcher/policy.py`, not `launcher/no_such_module.py` or\n"
        "`launcher/gone/{a,b}.toml`; `launcher/<run>/x.json` is written at run time.\n",
        encoding="utf-8")
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "policy.py").write_text("", encoding="utf-8")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        links = broken_links(page)
        flags = unknown_flags(page)
        paths = missing_paths(page)
    finally:
        ROOT = saved
    assert links == ["docs/page.md: link to missing missing.md",
                     "docs/page.md: link to missing heading other.md#nope"]
    assert flags == ["docs/page.md:4: resilient-health check has no --no-such-flag in its --help",
                     "docs/page.md:8: resilient-slurm sandbox up has no --bogus in its --help"]
    assert paths == ["docs/page.md:10: no such path launcher/no_such_module.py",
                     "docs/page.md:11: no such path launcher/gone"]
