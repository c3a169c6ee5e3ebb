"""The CPU study: where batch-size invariance breaks on the chained-sum testbed, GRPO and PPO.

    python launch/study.py --study=configs/studies/chain_sum_cpu.py --workdir=runs/study \\
        --parallel=2
    python launch/study.py --study=configs/studies/chain_sum_cpu.py:tiny ...   # the tests' shape

Stages (rlscale/study/study.py), in order:
  target     GRPO at the reference batch (P = 2, B0 = 16) and the starting rate 1e-4, the 3
             scan seeds, 8,192 responses: the study's target is 80% of the way from the base
             to their median final value (~0.51), fixed before any rate is scanned (at 75%,
             0.49, B = 256 took 8 optimizer steps at its best rate: fewer than 10);
  grpo_lr    GRPO's rate at every batch, P = 1 ... 32 at G = 8 (B = 8 ... 256), 5 rates sqrt(2)
             apart centred on 2e-4 (B/16)^(1/4), bracketing both a fixed rate and the sqrt
             rule (grpo_chain_sum.lr_grid),
             3 seeds; chooses every P at once by the joint fit of E(B, lr)
             (rlscale/study/lr_fit.py), extending a scan whose choice is at its edge;
  grpo       every P at its chosen rate on 10 fresh seeds, and at the rate its own scan chose
             where that differs (at its runner-up where the joint fit is not identified; the
             power calculation from the scan's seed spread is recorded beside them);
  pairs      (P, G) = (8, 4) and (2, 16), equal P x G to (4, 8), at that batch's chosen rate;
  ppo_lr     PPO's actor rate at B = 8, 16, 64, 256 (G = 4), 3 rates sqrt(2) apart centred on
             the rate GRPO's scan chose at the same B (with 5 of GRPO's rates PPO chose GRPO's
             rate at every B: the 3 cost 60% of the 5's runs), the same 3 scan seeds, the
             same joint fit, an edge choice extended;
  ppo        each at its chosen rate (and its own scan's where that differs), 10 fresh seeds as
             GRPO's verdict.
Every run's budget grows with B so that every verdict seed crosses (a scan's is shorter: it
ranks rates), and a run of the scans, the verdicts and the pairs ends at its first evaluation
past 1.25 x its responses to target (grpo_chain_sum.STOP; runs side by side stop lane by lane,
a group of them re-forming without its stopped lanes); gradient clipping is off. Then
analysis/report.py writes <workdir>/report/.
"""

from rlscale.study.study import Stage

GRPO = "configs/grpo_chain_sum.py"
PPO = "configs/ppo_chain_sum.py"


def stages(arg=None):
  tiny = ":tiny" if arg == "tiny" else ""
  extend = 0.0 if tiny else 2 ** 0.5  # tiny models learn nothing: no edge to extend
  # The tests' shape runs 2 verdict seeds. The full study runs 10 whatever the power
  # calculation asks (at the chain-sum spread, 0.28, a true ratio of 1.5 needs ~31 a side to
  # settle as broken at 80%, 3x the verdict's runs): the report prints what 10 can settle.
  seeds = dict(min_seeds=2, max_seeds=2) if tiny else dict(min_seeds=10, max_seeds=10)
  return [
      Stage("target", GRPO + tiny, "reference", target_fraction=0.8),
      Stage("grpo_lr", GRPO + tiny, "lr_scan", choose="lr", per=("p",), extend=extend,
            vectorize="lanes", joint=True),
      Stage("grpo", GRPO + tiny, "confirm", seeds_from="grpo_lr", vectorize="lanes", **seeds),
      Stage("pairs", GRPO + tiny, "pairs", seeds_from="grpo_lr", vectorize="lanes", **seeds),
      Stage("ppo_lr", PPO + tiny, "lr_scan", choose="optim.lr", per=("p",), extend=extend,
            vectorize="lanes", joint=True),
      Stage("ppo", PPO + tiny, "confirm", seeds_from="ppo_lr", vectorize="lanes", **seeds),
  ]
