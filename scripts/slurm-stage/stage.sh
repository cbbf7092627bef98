#!/usr/bin/env bash
# The version stages: the Slurm-facing and the launcher's cluster tests again on another Slurm
# and nvidia-resiliency-ext, in a Debian root built once with debootstrap and cached.
#
#   scripts/slurm-stage/stage.sh STAGE [pytest args...]   (root; extra args go to pytest)
#   scripts/slurm-stage/stage.sh STAGE --shell 'COMMAND'  (COMMAND in the root instead)
#
# STAGE names a profile beside this script: slurm24 (Debian 13, Slurm 24.11, NVRx 0.6, the host's
# Python 3.11) or slurm26 (Debian sid, Slurm 26.05, NVRx 0.7, sid's Python 3.14 and torch).
# What it does:
#   1. builds or reuses $RS_CACHE_DIR/<stage>-<suite>-<hash of build-root.sh and the profile>
#      (debootstrap, minbase, the profile's packages); a changed recipe builds a new root and
#      removes the stage's old ones;
#   2. for a profile that takes torch as a wheel, copies it from wherever this machine's pip
#      finds it into the root;
#   3. enters private mount + PID namespaces (enter.sh), mounts /proc, /dev, /sys, a fresh
#      /tmp, this machine's Python 3.11 where the profile uses it (read-only, same path), pip's
#      CA bundle and the repository at /src, and runs inside.sh in the root: a venv (torch,
#      NVRx, the project, editable), then pytest on the selection below against the sandbox
#      it starts;
#   4. leaves nothing behind: the namespaces' mounts and processes end with them, and it
#      checks afterwards (mounts under the root, processes whose root is the root).
# Two different stages can run at once (one lock per stage); the same stage waits for the other.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
stage=${1:-}
die() { echo "${stage:-stage}: $*" >&2; exit 2; }
say() { echo "$stage: $*"; }
case $stage in
    slurm24|slurm26) shift;;
    *) die "usage: stage.sh slurm24|slurm26 [pytest args...] (profiles: $here/*.conf)";;
esac
SUITE="" PACKAGES=() PYTHON="" TORCH=""
# shellcheck source=/dev/null
source "$here/$stage.conf"

# -- what runs, in every stage: the Slurm-facing tests, NVRx's async checkpointing, and the
#    launcher's cluster tests (restarts, budgets and verdicts, signals and requeues, in-process,
#    outside scripts) as whole files, so a test added to one of them runs in every stage.
# On STAGE_WORKERS pytest-xdist workers (default 2; 0: one process), grouped as in `make test`
# (tests/conftest.py): the two long launcher files then run side by side, each on its own sandbox.
SELECT=(
    -n "${STAGE_WORKERS:-2}" --dist loadgroup
    tests/slurm/test_seam_cluster.py
    tests/slurm/test_doctor.py
    tests/test_skip_policy.py
    tests/hooks/test_hooks_cluster.py
    tests/checkpoint/test_checkpoint.py
    tests/launcher/test_launch_slurm.py
    tests/launcher/test_foreign_slurm.py
    tests/launcher/test_inprocess_slurm.py
    tests/launcher/test_requeue_slurm.py
    tests/launcher/test_spares_slurm.py
    # Slow duplicates the main stage alone runs: 200 direct health-program runs on healthy nodes
    # make no Slurm call at all (issue 12; 3 minutes); the two production-timing launcher tests
    # repeat the time-limit signal and the stalled-controller requeue above with the real 120 s
    # credential expiry (3-6 minutes each).
    --deselect tests/hooks/test_hooks_cluster.py::test_200_health_runs_on_healthy_and_boot_noise_nodes_never_drain
    --deselect tests/launcher/test_launch_slurm.py::test_production_time_limit_as_user
    --deselect tests/launcher/test_launch_slurm.py::test_production_node_fault_requeue_controller_stalled_as_user
    # The launcher's own decisions, the same on every Slurm and NVRx (the restart, hang and
    # crash paths each stage still meets in test_foreign_slurm.py's NVRx output): main stage only.
    --deselect tests/launcher/test_launch_slurm.py::test_deterministic_crash_verdict
    --deselect tests/launcher/test_launch_slurm.py::test_exception_and_hang_restart_in_job
)

cache=${RS_CACHE_DIR:-/var/cache/resilient-slurm}
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, namespaces, the sandbox's daemons)"
for tool in unshare chroot findmnt flock; do
    command -v "$tool" >/dev/null || die "$tool missing (util-linux, coreutils)"
done
if ! command -v debootstrap >/dev/null; then
    # .ci/run starts both stages at once: one installs, the other waits on this lock (and
    # apt itself waits for dpkg's lock rather than failing at once on another apt run).
    mkdir -p "$cache"
    exec 8>"$cache/.apt.lock"
    flock 8
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap"
        export DEBIAN_FRONTEND=noninteractive
        apt=(apt-get -o DPkg::Lock::Timeout=300 -y -qq --no-install-recommends)
        "${apt[@]}" install debootstrap >/dev/null 2>&1 || {
            apt-get -o DPkg::Lock::Timeout=300 update -qq && "${apt[@]}" install debootstrap \
                >/dev/null
        }
    fi
    flock -u 8
    exec 8>&-
fi

# The interpreter the venv is built from: this machine's Python 3.11 (mounted at its own path),
# or one the root itself carries.
python="" prefix=""
if [ "$PYTHON" = host3.11 ]; then
    for cand in python3 python3.11 /root/.pyenv/versions/3.11*/bin/python3.11; do
        exe=$(command -v "$cand" 2>/dev/null) || continue
        if "$exe" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            python=$exe; break
        fi
    done
    [ -n "$python" ] || die "no Python 3.11 found (python3, python3.11, /root/.pyenv/versions/3.11*)"
    prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
    [ -x "$prefix/bin/python3.11" ] || die "$prefix/bin/python3.11 missing (Python 3.11 from $python)"
    case $prefix in /usr|/usr/local) die "Python 3.11 at $prefix would hide the root's own /usr: use a pyenv or other separate prefix";; esac
    rootpython=$prefix/bin/python3.11
else
    rootpython=$PYTHON
fi

mkdir -p "$cache"
exec 9>"$cache/$stage.lock"
flock -w 3600 9 || die "another $stage run holds $cache/$stage.lock"

recipe=$(cat "$here/build-root.sh" "$here/$stage.conf" | sha256sum | cut -c1-12)
# Named after the stage: checkouts of an older layout remove "trixie-*" roots, not these.
root=$cache/$stage-$SUITE-$recipe
start=$(date +%s)
if [ ! -f "$root/.rs-complete" ]; then
    say "building the Debian $SUITE root $root (debootstrap, a few minutes)"
    rm -rf "$root.tmp"
    unshare --mount --propagation private "$here/build-root.sh" "$root.tmp" "$SUITE" "${PACKAGES[@]}" \
        >"$cache/build-$stage-$recipe.log" 2>&1 || {
        tail -20 "$cache/build-$stage-$recipe.log" >&2; rm -rf "$root.tmp"
        die "debootstrap failed (log: $cache/build-$stage-$recipe.log)"
    }
    touch "$root.tmp/.rs-complete"
    mv "$root.tmp" "$root"
    # This stage's older roots: no run uses them (every run of this stage holds the lock above).
    for old in "$cache/$stage-$SUITE"-*; do
        [ "$old" != "$root" ] && [ -d "$old" ] || continue
        say "removing the old root $old"; rm -rf "$old"
    done
    say "root built in $(( $(date +%s) - start )) s"
else
    say "reusing $root"
fi

# A torch wheel, from wherever this machine's pip takes it (a local wheel here).
case $TORCH in
    wheel:*)
        spec=${TORCH#wheel:}
        wheels=$root/opt/rs-wheels
        if ! compgen -G "$wheels/torch-${spec#torch==}*.whl" >/dev/null; then
            say "copying the $spec wheel into the root"
            "$python" -m pip download -q --no-deps --only-binary=:all: "$spec" -d "$wheels"
        fi;;
    pypi:*) ;;
    *) die "TORCH=$TORCH in $stage.conf: wheel:SPEC or pypi:SPEC";;
esac

# The CA bundle this machine's pip trusts (a site may intercept TLS with its own CA).
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
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
    [ -z "$left" ] || { echo "$stage: mounts left under $root:" >&2; echo "$left" >&2; status=1; }
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" != "$root" ] || procs+=" ${p#/proc/}"
    done
    [ -z "$procs" ] || { echo "$stage: processes left in $root:$procs" >&2; status=1; }
    say "stage finished in $(( $(date +%s) - start )) s (exit $status)"
}
status=0
trap 'say "interrupted: stopping the tests"; stop; status=130; verify; exit 130' INT TERM

unshare --mount --pid --fork --propagation private --kill-child \
    "$here/enter.sh" "$stage" "$root" "$repo" "$rootpython" "$TORCH" "$prefix" "$cert" \
    "${SELECT[@]}" "$@" &
child=$!
wait "$child" || status=$?
child=""
verify
exit "$status"
