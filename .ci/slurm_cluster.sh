#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests/e2e/test_slurm_real.py (run by .ci/run):
#   .ci/slurm_cluster.sh start   install (Debian packages) and start munged, slurmctld, slurmd
#   .ci/slurm_cluster.sh stop    stop them
# As root, no accounting database (sacct is refused: the sweep's run directories decide).
# Without root or apt, `start` says why and exits 1 (the test then says it was not run).
set -euo pipefail
STATE=/var/spool/rlscale-slurm
case "${1:-}" in
  start)
    if [ "$(id -u)" != 0 ]; then echo "slurm cluster: needs root" >&2; exit 1; fi
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
      pkgs=(slurmctld slurmd slurm-client munge)
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends \
            "${pkgs[@]}" >/dev/null; }
    fi
    host=$(hostname -s)
    read -r cpus mem < <(slurmd -C | awk -F'[= ]' '/^NodeName/ {for (i=1;i<=NF;i++) {
      if ($i=="CPUs") c=$(i+1); if ($i=="RealMemory") m=$(i+1)}; print c, m}')
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" /run/munge /var/log/slurm
    cat > /etc/slurm/slurm.conf <<CONF
ClusterName=rlscale-ci
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
KillWait=30
MinJobAge=600
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chmod 400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || munged --force
    pgrep -x slurmctld >/dev/null || slurmctld -c
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 60); do
      if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "slurm cluster: up ($host, $cpus CPUs, $mem MB)"; exit 0
      fi
      sleep 1
    done
    echo "slurm cluster: did not come up; see /var/log/slurm" >&2; exit 1;;
  stop)
    pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
    for _ in $(seq 40); do  # they exit within a second or two
      pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null ||
        pgrep -x munged >/dev/null || break
      sleep 0.25
    done
    rm -rf "$STATE";;
  *) echo "usage: $0 start|stop" >&2; exit 2;;
esac
