"""The rate of the model's own matmuls, in JAX (XLA) or in PyTorch (the peers' kernels).

    python benchmarks/matmul_shapes.py                     # JAX, this project's venv
    PEER_PYTHON benchmarks/matmul_shapes.py --framework=torch   # the peers' venv (TRL, HF)

The 2048^2 matmul that rl_step.py and issue goals use as the machine's reference is not the
shape a small model multiplies. This times, for the layer shape of benchmarks/model_shape.py's
defaults (d 256, 4 heads of 64, 2 KV heads, MLP 704), every weight of a layer in the three
products of training -- forward x @ W, input gradient dy @ W^T, weight gradient x^T @ dy -- at
`--rows` rows (a training micro-batch: 64 rows x 96 tokens), and the forward alone at
`--decode_rows` rows (one decode step), plus the `--square` matmul. float32, `--threads` threads
for PyTorch (XLA's CPU backend uses the machine's cores). Prints one JSON line with GFLOP/s per
set (total FLOPs over total median time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--framework", choices=["jax", "torch"], default="jax")
for name, default in [("d_model", 256), ("heads", 4), ("kv_heads", 2), ("head_dim", 64),
                      ("mlp_dim", 704), ("rows", 6144), ("decode_rows", 64), ("square", 2048),
                      ("repeats", 9), ("threads", 2)]:
  ap.add_argument(f"--{name}", type=int, default=default)
a = ap.parse_args()


def weights() -> dict[str, tuple[int, int]]:
  q_kv = (a.heads + 2 * a.kv_heads) * a.head_dim
  return {"qkv": (a.d_model, q_kv), "o": (a.heads * a.head_dim, a.d_model),
          "gate": (a.d_model, a.mlp_dim), "up": (a.d_model, a.mlp_dim),
          "down": (a.mlp_dim, a.d_model)}


def products(rows: int, training: bool) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
  """(name, lhs shape, rhs shape) of each product, as plain 2-D matmuls (transposes made
  explicit by the caller's ops)."""
  out = []
  for name, (k, n) in weights().items():
    out.append((f"{name}_fwd", (rows, k), (k, n)))
    if training:
      out.append((f"{name}_dx", (rows, n), (n, k)))  # dy @ W^T
      out.append((f"{name}_dw", (k, rows), (rows, n)))  # x^T @ dy
  return out


def median_s(fn) -> float:
  fn(), fn()
  times = []
  for _ in range(a.repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def timer():
  """A function (lhs shape, rhs shape, transposed how) -> median seconds of that matmul."""
  if a.framework == "torch":
    import torch
    torch.set_num_threads(a.threads)

    def run(ls, rs, name):
      x, w = _operands_torch(torch, ls, rs, name)
      with torch.no_grad():
        return median_s(lambda: x @ w)
    return run, {"torch": torch.__version__, "threads": a.threads}
  import jax
  import jax.numpy as jnp
  import numpy as np

  def run(ls, rs, name):
    rng = np.random.default_rng(0)
    # Stored as the model stores them: the gradient products take a transposed view.
    if name.endswith("_dx"):
      x, w = rng.standard_normal(ls), rng.standard_normal(rs[::-1])
      f = jax.jit(lambda x, w: x @ w.T)
    elif name.endswith("_dw"):
      x, w = rng.standard_normal(ls[::-1]), rng.standard_normal(rs)
      f = jax.jit(lambda x, w: x.T @ w)
    else:
      x, w = rng.standard_normal(ls), rng.standard_normal(rs)
      f = jax.jit(lambda x, w: x @ w)
    x, w = jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32)
    return median_s(lambda: f(x, w).block_until_ready())
  return run, {"jax": jax.__version__, "devices": jax.device_count()}


def _operands_torch(torch, ls, rs, name):
  if name.endswith("_dx"):
    return torch.randn(*ls), torch.randn(*rs[::-1]).T
  if name.endswith("_dw"):
    return torch.randn(*ls[::-1]).T, torch.randn(*rs)
  return torch.randn(*ls), torch.randn(*rs)


def rate(run, prods) -> tuple[float, dict[str, float]]:
  total_flops = total_s = 0.0
  each = {}
  for name, ls, rs in prods:
    s = run(ls, rs, name)
    flops = 2 * ls[0] * ls[1] * rs[1]
    each[name] = round(flops / s / 1e9, 1)
    total_flops, total_s = total_flops + flops, total_s + s
  return round(total_flops / total_s / 1e9, 1), each


def main():
  run, versions = timer()
  train, train_each = rate(run, products(a.rows, training=True))
  decode, decode_each = rate(run, products(a.decode_rows, training=False))
  square, _ = rate(run, [("square_fwd", (a.square, a.square), (a.square, a.square))])
  print(json.dumps({"benchmark": "matmul_shapes", "framework": a.framework, **versions,
                    "rows": a.rows, "decode_rows": a.decode_rows, "square": a.square,
                    "square_gflops_per_s": square, "train_gflops_per_s": train,
                    "decode_gflops_per_s": decode,
                    "train_of_square": round(train / square, 3),
                    "decode_of_square": round(decode / square, 3),
                    "train_each": train_each, "decode_each": decode_each}), flush=True)


if __name__ == "__main__":
  main()
