"""Batch-size-invariant PPO (Hilton, Cobbe, Schulman 2021), "PPO-EWMA".

The clip anchor is a proximal policy kept as an EWMA of the actor's weights, whose centre of
mass in optimizer steps is `rl.prox_com` at `optim.reference_batch` and grows as B0/B at
smaller batches (rl/trained.py), while the behaviour policy (the sampler's log-probs) stays
the importance-sampling denominator (rl/losses.decoupled_surrogate). Everything else is PPO.
"""

from __future__ import annotations

from rlscale.rl import algorithm
from rlscale.rl.ppo import PPO


@algorithm.ALGORITHMS.register("ppo_ewma")
class PPOEWMA(PPO):

  @staticmethod
  def check(cfg) -> list[str]:
    errors = PPO.check(cfg)
    prox = cfg.rl.get("prox_com")
    if isinstance(prox, (int, float)) and prox <= 0:
      errors.append(f"rl.prox_com={cfg.rl.prox_com}: ppo_ewma needs the proximal policy's "
                    f"centre of mass (> 0, in optimizer steps at optim.reference_batch)")
    return errors

  def __init__(self, ctx: algorithm.Context):
    self.prox_com = float(ctx.cfg.rl.prox_com)
    super().__init__(ctx)
