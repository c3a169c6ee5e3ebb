"""The Slurm launcher's settings (`--slurm`): what each point's job asks of the cluster.

    python launch/sweep.py ... --launcher=slurm --slurm.partition=gpu --slurm.gpus_per_node=8
    python launch/sweep.py ... --launcher=slurm --slurm=mysite.py --slurm.nodes=2

A site file (`--slurm=mysite.py`) is a copy of this one with the cluster's partition, account
and setup filled in; single fields override it from the command line. rlscale/sweep/launchers/slurm.py
checks every field before anything is submitted.

Processes: `tasks_per_node=1` starts one process per node that drives all of its GPUs;
`tasks_per_node=gpus_per_node` one process per GPU. Without GPUs (CPU nodes, tests) any number.
"""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.nodes = 1  # nodes per point; a point on several runs as one jax.distributed job
  c.tasks_per_node = 1  # processes per node: 1 (each sees all its node's GPUs) or gpus_per_node
  c.gpus_per_node = 0  # GPUs per node (#SBATCH --gpus-per-node); 0: CPU nodes
  c.cpus_per_task = 0  # CPU cores per process; 0: the cluster's default (often 1: set it)
  c.mem = ""  # memory per node, e.g. "64G"; "0": all of it; "": the cluster's default
  c.partition = ""  # e.g. "gpu"; "": the cluster's default
  c.time = ""  # time limit per job, e.g. "4:00:00" or "1-00:00:00"; "": the partition's
  c.account = ""  # the account charged; "": yours by default
  c.qos = ""  # quality of service; "": the default
  c.constraint = ""  # node features, e.g. "h100"; "": any node of the partition
  c.job_name = ""  # "": rlscale-<sweep>
  # Seconds before the time limit at which the runs get SIGUSR2: they finish the step, save
  # it and exit 75, and the job requeues itself. Allow a step plus a checkpoint's save.
  c.signal_seconds = 300
  # Requeues of a job (preemptions, time limits) before it stops as preempted; running the
  # sweep again submits it anew, resuming from its checkpoint.
  c.max_requeues = 20
  c.setup = ""  # shell lines run before each job, e.g. "module load cuda; source venv/bin/activate"
  c.sbatch_args = ""  # more #SBATCH options, e.g. "--exclusive --reservation=big"
  c.srun_args = ""  # more srun options, e.g. "--cpu-bind=none"
  return c
