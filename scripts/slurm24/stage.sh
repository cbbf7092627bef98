#!/usr/bin/env bash
# `make test-slurm24`: the Slurm-facing tests on Slurm 24.11 and nvidia-resiliency-ext 0.6,
# in a Debian 13 (trixie) root built once with debootstrap and cached.
#
#   scripts/slurm24/stage.sh [pytest args...]   (root; extra args go to pytest)
#   scripts/slurm24/stage.sh --shell 'COMMAND'  (COMMAND in the root instead of the tests)
#
# What it does:
#   1. builds or reuses $RS_CACHE_DIR/trixie-<hash of build-root.sh> (debootstrap, minbase,
#      Slurm 24.11 + munge); a changed recipe builds a new root and removes the old ones;
#   2. copies the torch 2.13.0 wheel from wherever this machine's pip finds it into the root;
#   3. enters private mount + PID namespaces (enter.sh), mounts /proc, /dev, /sys, a fresh
#      /tmp, this machine's Python 3.11 (read-only, same path), pip's CA bundle and the
#      repository at /src, and
#      runs inside.sh in the root: a venv (torch, NVRx 0.6.x, the project, editable), then
#      pytest on the selection below against the sandbox it starts;
#   4. leaves nothing behind: the namespaces' mounts and processes end with them, and it
#      checks afterwards (mounts under the root, processes whose root is the root).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

# -- what runs: the Slurm-facing tests and NVRx's async checkpointing. Whole files, plus the
#    launcher's crash / hang / node-fault / requeue tests by node id (a renamed test fails the
#    stage loudly instead of silently dropping out of it).
L=tests/launcher/test_launch_slurm.py
SELECT=(
    tests/slurm/test_seam_cluster.py
    tests/slurm/test_doctor.py
    tests/hooks/test_hooks_cluster.py
    tests/training/test_checkpoint.py
    "$L::test_exception_and_hang_restart_in_job"
    "$L::test_deterministic_crash_verdict"
    "$L::test_node_fault_elastic"
    "$L::test_node_fault_requeue"
    # 200 direct health-program runs on healthy nodes make no Slurm call at all (issue 12): they
    # prove nothing version-specific and cost 3 minutes, so the main stage alone runs them.
    --deselect tests/hooks/test_hooks_cluster.py::test_200_health_runs_on_healthy_and_boot_noise_nodes_never_drain
)

cache=${RS_CACHE_DIR:-/var/cache/resilient-slurm}
say() { echo "slurm24: $*"; }
die() { echo "slurm24: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, namespaces, the sandbox's daemons)"
for tool in unshare chroot findmnt flock; do
    command -v "$tool" >/dev/null || die "$tool missing (util-linux, coreutils)"
done
if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 || {
        apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
fi

# This machine's Python 3.11: NVRx 0.6 and the local torch wheel are cp311.
python=""
for cand in python3 python3.11 /root/.pyenv/versions/3.11*/bin/python3.11; do
    exe=$(command -v "$cand" 2>/dev/null) || continue
    if "$exe" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        python=$exe; break
    fi
done
[ -n "$python" ] || die "no Python 3.11 found (python3, python3.11, /root/.pyenv/versions/3.11*)"
prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
pybin=$prefix/bin/python3.11
[ -x "$pybin" ] || die "$pybin missing (Python 3.11 from $python)"
case $prefix in /usr|/usr/local) die "Python 3.11 at $prefix would hide the root's own /usr: use a pyenv or other separate prefix";; esac

mkdir -p "$cache"
exec 9>"$cache/lock"
flock -w 3600 9 || die "another test-slurm24 run holds $cache/lock"

recipe=$(sha256sum "$here/build-root.sh" | cut -c1-12)
root=$cache/trixie-$recipe
start=$(date +%s)
if [ ! -f "$root/.rs-complete" ]; then
    say "building the Debian 13 root $root (debootstrap, a few minutes)"
    rm -rf "$root.tmp"
    unshare --mount --propagation private "$here/build-root.sh" "$root.tmp" \
        >"$cache/build-$recipe.log" 2>&1 || {
        tail -20 "$cache/build-$recipe.log" >&2; rm -rf "$root.tmp"
        die "debootstrap failed (log: $cache/build-$recipe.log)"
    }
    touch "$root.tmp/.rs-complete"
    mv "$root.tmp" "$root"
    for old in "$cache"/trixie-*; do
        [ "$old" = "$root" ] || { say "removing the old root $old"; rm -rf "$old"; }
    done
    say "root built in $(( $(date +%s) - start )) s"
else
    say "reusing $root"
fi

# The torch wheel, from wherever this machine's pip takes torch==2.13.0 (a local wheel here).
wheels=$root/opt/rs-wheels
if ! compgen -G "$wheels/torch-2.13.0*.whl" >/dev/null; then
    say "copying the torch 2.13.0 wheel into the root"
    "$python" -m pip download -q --no-deps --only-binary=:all: torch==2.13.0 -d "$wheels"
fi

# The CA bundle this machine's pip trusts (a site may intercept TLS with its own CA).
cert=${PIP_CERT:-$("$python" -m pip config get global.cert 2>/dev/null || true)}
[ -f "$cert" ] || cert=/etc/ssl/certs/ca-certificates.crt
[ -f "$cert" ] || die "no CA bundle for pip (set PIP_CERT)"

[ "${1:-}" != --shell ] || SELECT=()

child=""
stop() {
    # Ask the namespace's first process to stop the tests (pytest brings its sandbox down);
    # whatever is left when it exits, the kernel kills with the PID namespace.
    [ -n "$child" ] || return 0
    local init
    init=$(awk '{print $1}' "/proc/$child/task/$child/children" 2>/dev/null || true)
    [ -z "$init" ] || kill -TERM "$init" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$child" 2>/dev/null || return 0; sleep 1; done
    kill -KILL "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
}
verify() {
    # Nothing of the stage may outlive it: no mount under the root, no process running in it.
    local left procs="" p
    left=$(findmnt -rn -o TARGET | grep -F "$root" || true)
    [ -z "$left" ] || { echo "slurm24: mounts left under $root:" >&2; echo "$left" >&2; status=1; }
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" != "$root" ] || procs+=" ${p#/proc/}"
    done
    [ -z "$procs" ] || { echo "slurm24: processes left in $root:$procs" >&2; status=1; }
    say "stage finished in $(( $(date +%s) - start )) s (exit $status)"
}
status=0
trap 'say "interrupted: stopping the tests"; stop; status=130; verify; exit 130' INT TERM

unshare --mount --pid --fork --propagation private --kill-child \
    "$here/enter.sh" "$root" "$repo" "$prefix" "$cert" "${SELECT[@]}" "$@" &
child=$!
wait "$child" || status=$?
child=""
verify
exit "$status"
