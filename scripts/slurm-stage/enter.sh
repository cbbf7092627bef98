#!/usr/bin/env bash
# The first process of the stage's private mount + PID namespaces (started by stage.sh):
# mounts what the root needs, runs inside.sh there, unmounts. Every mount made here lives only
# in this mount namespace and every process started here only in this PID namespace, so both
# end with it even if this script is killed.
#
#   enter.sh STAGE ROOT REPO PYTHON TORCH PYTHON_PREFIX CA_BUNDLE [pytest args...]
#   (PYTHON_PREFIX: a host Python to mount at its own path, or "" for the root's own)
set -euo pipefail
stage=$1 root=$2 repo=$3 python=$4 torch=$5 prefix=$6 cert=$7
shift 7

mounted=()
bind() {  # bind SRC DST [ro]
    local src=$1 dst=$root$2
    if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; touch "$dst"; fi
    mount --bind "$src" "$dst"
    [ "${3:-}" != ro ] || mount -o remount,bind,ro "$dst"
    mounted+=("$dst")
}
pid=""
cleanup() {
    [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
    [ -z "$pid" ] || wait "$pid" 2>/dev/null || true
    local i
    for (( i=${#mounted[@]}-1; i>=0; i-- )); do umount -R "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 143' TERM INT

mount -t proc proc "$root/proc"; mounted+=("$root/proc")
mount --rbind /sys "$root/sys"; mounted+=("$root/sys")
mount --rbind /dev "$root/dev"; mounted+=("$root/dev")
mount -t tmpfs -o mode=1777 rs-shm "$root/dev/shm"; mounted+=("$root/dev/shm")
mount -t tmpfs -o mode=1777 rs-tmp "$root/tmp"; mounted+=("$root/tmp")
[ -z "$prefix" ] || bind "$prefix" "$prefix" ro
bind "$repo" /src
bind /etc/resolv.conf /etc/resolv.conf ro
bind /etc/hosts /etc/hosts ro
bind "$cert" /etc/rs-pip-ca.crt ro

# A clean environment: nothing of the host's pip set-up, virtualenv or Slurm leaks in.
chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" \
    /bin/bash /src/scripts/slurm-stage/inside.sh "$stage" "$python" "$torch" "$@" &
pid=$!
status=0
wait "$pid" || status=$?
pid=""
# The tests stop what they start: a daemon still here is a failure (the namespace's end would
# hide it otherwise).
left=""
for d in "$root"/proc/[0-9]*; do
    case $(cat "$d/comm" 2>/dev/null) in
        slurmctld|slurmd|slurmstepd|munged) left+=" ${d##*/}:$(cat "$d/comm")";;
    esac
done
if [ -n "$left" ]; then
    echo "$stage: daemons left running after the tests:$left" >&2
    status=1
fi
exit "$status"
