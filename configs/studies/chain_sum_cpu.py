"""The CPU study: batch size on the chained-sum testbed, in under an hour on two cores.

    python launch/study.py --study=configs/studies/chain_sum_cpu.py --workdir=runs/study \\
        --parallel=2
    python launch/study.py --study=configs/studies/chain_sum_cpu.py:tiny ...   # the tests' shape

Stages (rlscale/sweep/study.py), in order:
  lr     the learning rate at the reference batch (P=32, G=8: 256 responses per optimizer
         step), 3 values x 2 seeds; the one reaching the target in the fewest responses is
         used by every later stage, so that LR rules are compared from a tuned reference;
  batch  P = 16 ... 256 at G=8 with the sqrt rule and with a fixed lr, 2 seeds, equal responses;
  pairs  (P, G) = (16, 16) and (64, 4): equal P x G to the reference's (32, 8);
  ppo    PPO's actor and critic at B = 512 ... 64 responses per optimizer step (their
         mini-batch counts), for their gradient norms against the batch.
Then analysis/report.py writes <workdir>/report/.
"""

from rlscale.sweep.study import Stage

GRPO = "configs/grpo_chain_sum.py"
PPO = "configs/ppo_chain_sum.py"


def stages(arg=None):
  tiny = ":tiny" if arg == "tiny" else ""
  chosen = (",tiny" if tiny else "") + ",lr={lr}"
  return [
      Stage("lr", GRPO + tiny, "lr_tuning", choose="lr"),
      Stage("batch", GRPO + ":" + chosen.lstrip(","), "batch_invariance"),
      Stage("pairs", GRPO + ":" + chosen.lstrip(","), "group_vs_prompts"),
      Stage("ppo", PPO + tiny, "actor_critic"),
  ]
