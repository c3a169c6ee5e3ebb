"""The CPU study: batch size on the chained-sum testbed, in under 90 minutes on two cores.

    python launch/study.py --study=configs/studies/chain_sum_cpu.py --workdir=runs/study \\
        --parallel=2
    python launch/study.py --study=configs/studies/chain_sum_cpu.py:tiny ...   # the tests' shape

Stages (rlscale/sweep/study.py), in order:
  grpo_lr  GRPO's learning rate at every batch, P = 1 ... 8 at G = 8 (B = 8 ... 64
           responses per optimizer step), 4 rates per P around the sqrt rule, 3 seeds; it sets
           the study's target on the sampled held-out accuracy (70% of the way from the base to
           the best median final value) and chooses the rate with the fewest responses to it
           per P among the stable ones, extending a scan whose best rate is at its edge;
  grpo     every P at its own best rate and at the reference batch's (P = 2, B0 = 16), 5 seeds
           the scan did not choose with: where does invariance break at the best rate, and
           what does a fixed rate cost?
  pairs    (P, G) = (8, 4) and (2, 16), equal P x G to (4, 8), at that batch's best rate;
  ppo_lr   PPO's actor rate at P x G = 16, 32, 64 (G = 4), 4 rates, 1 seed, chosen per P;
  ppo      each at its chosen rate, 3 fresh seeds; the critic's 512 warm-up responses are
           the same at every batch and counted apart.
Then analysis/report.py writes <workdir>/report/.
"""

from rlscale.sweep.study import Stage

GRPO = "configs/grpo_chain_sum.py"
PPO = "configs/ppo_chain_sum.py"


def stages(arg=None):
  tiny = ":tiny" if arg == "tiny" else ""
  extend = 0.0 if tiny else 2 ** 0.5  # tiny models learn nothing: no edge to extend
  return [
      Stage("grpo_lr", GRPO + tiny, "lr_scan", choose="lr", per=("p",), extend=extend,
            target_fraction=0.7),
      Stage("grpo", GRPO + tiny, "confirm"),
      Stage("pairs", GRPO + tiny, "pairs"),
      Stage("ppo_lr", PPO + tiny, "lr_scan", choose="optim.lr", per=("p",), extend=extend),
      Stage("ppo", PPO + tiny, "confirm"),
  ]
