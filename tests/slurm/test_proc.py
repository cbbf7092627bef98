import os
import sys
import time

import pytest

from resilient_slurm import proc


def test_ok_and_output() -> None:
    out = proc.run([sys.executable, "-c", "print('hi')"], timeout=10)
    assert out.kind == proc.OK and out.ok and out.stdout.strip() == "hi"


def test_missing_program() -> None:
    out = proc.run(["/nonexistent/tool", "--x"], timeout=5)
    assert out.kind == proc.MISSING and not out.ok
    assert "not found" in out.describe()


def test_nonzero_keeps_message() -> None:
    out = proc.run([sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(4)"],
                   timeout=10)
    assert out.kind == proc.NONZERO and out.returncode == 4
    assert "boom" in out.describe()


def test_timeout_kills_whole_group(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    out = proc.run([sys.executable, "-c", code], timeout=1.5)
    assert out.kind == proc.TIMEOUT
    assert time.monotonic() - start < 5
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("grandchild survived the timeout")


def test_refuses_shell_string() -> None:
    with pytest.raises(TypeError):
        proc.run("echo hi", timeout=1)  # a str is a Sequence[str] to mypy: refused at run time


def test_not_executable(tmp_path) -> None:
    f = tmp_path / "tool"
    f.write_text("#!/bin/sh\necho hi\n")
    os.chmod(f, 0o644)
    assert proc.run([str(f)], timeout=5).kind == proc.MISSING
