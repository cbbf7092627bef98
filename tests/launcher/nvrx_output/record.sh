#!/usr/bin/env bash
# Records what the installed NVRx's ft_launcher prints, as test data for launcher/observe.py
# and launcher/restarts.py (a parser test per NVRx version runs against this real output):
#   record.sh OUTDIR      (OUTDIR/<version>/ gets help.txt, restart.log, cycle_info/)
# One node, two ranks on CPU (gloo): the first attempt's rank 1 raises, the second attempt's
# rank 0 is SIGKILLed, the third completes: two in-job restarts.
set -euo pipefail
out=$1
ver=$(python -c 'from importlib.metadata import version; print(version("nvidia-resiliency-ext"))')
dir=$out/$ver
rm -rf "$dir"; mkdir -p "$dir/cycle_info"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/worker.py" <<'PY'
import os, signal, sys, time
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
dist.init_process_group("gloo")
mon = RankMonitorClient()
mon.init_workload_monitoring()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = dist.get_rank()
for step in range(5):
    mon.send_heartbeat()
    dist.barrier()
    time.sleep(0.1)
    if attempt == 0 and rank == 1 and step == 2:
        raise RuntimeError("injected exception")
    if attempt == 1 and rank == 0 and step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
mon.shutdown_workload_monitoring()
dist.destroy_process_group()
PY
ft_launcher --help >"$dir/help.txt" 2>&1 || true
cycle=()
if grep -q -- "--ft-cycle-info-dir" "$dir/help.txt"; then cycle=(--ft-cycle-info-dir="$dir/cycle_info"); fi
SLURM_JOB_ID=4242 SLURM_TASKS_PER_NODE=1 SLURM_PROCID=0 SLURM_NODEID=0 SLURM_LOCALID=0 \
    SLURM_NTASKS=1 SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURMD_NODENAME=node1 ft_launcher --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:29517 --rdzv-id=rs-4242-r0-c1 --max-restarts=3 \
    --ft-initial-rank-heartbeat-timeout=60 --ft-rank-heartbeat-timeout=30 \
    --ft-enable-nic-monitor=false --monitor-interval=0.5 "${cycle[@]}" \
    "$tmp/worker.py" >"$dir/restart.stdout" 2>"$dir/restart.log" && echo 0 >"$dir/rc" || echo $? >"$dir/rc"
sed -i "s#$tmp#/TMP#g" "$dir/restart.log" "$dir/restart.stdout"
ls -la "$dir/cycle_info" >"$dir/cycle_info.ls" 2>&1 || true
echo "recorded $dir (rc $(cat "$dir/rc"))"
