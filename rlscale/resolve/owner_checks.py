"""The checks of the config sections whose owners build nothing at resolve time: the algorithm's
own fields (rlscale/rl/algorithm.py: each algorithm file checks its own), the optimizers'
(rlscale/rl/optim.py) and the rollout's sampling (rlscale/sampling: SamplingParams). Every
error names the field and its value.

The resolve step (resolve/resolved.py) runs these after the plain field checks
(rlscale/config/fields.py) and before it builds the parts that check themselves as they are
built: meshes, model config, task (resolve/experiment.py) and the batch plan (plan/batch.py).
"""

from __future__ import annotations

import ml_collections

from rlscale.rl import algorithm, optim
from rlscale.sampling import SamplingParams

__all__ = ["errors"]


def errors(cfg: ml_collections.ConfigDict) -> list[str]:
  """The errors the algorithm, the optimizers and the sampler find in `cfg`."""
  found = [] if cfg.kind == "sft" else algorithm.check(cfg)
  found += optim.check(cfg.optim, "optim")
  if cfg.kind == "sft":
    return found
  if "critic" in cfg:
    found += optim.check(cfg.critic.optim, "critic.optim")
  ro = cfg.rollout
  try:
    SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=1.0, top_k=ro.top_k,
                   top_p=ro.top_p, decode_chunk=ro.decode_chunk)
  except (ValueError, TypeError) as e:  # "sampling: a=1 must ...; b=2 must ..."
    found += ["rollout." + m for m in str(e).removeprefix("sampling: ").split("; ")]
  return found
