#!/usr/bin/env bash
# The GPU check of the step's speed, one JSON line per benchmark into $OUT/results.jsonl:
# a Qwen2.5-0.5B-shaped policy in bf16 on one accelerator.
#   decode (benchmarks/decode.py): 64 and 256 rows of prompt 32 + 64 new tokens, and 64 rows of
#     prompt 128 + 512 new: the decode step's share of the memory roofline
#     (decode_fraction_of_hbm; decode_fraction_of_bandwidth in the 64-row run, which measures
#     the bandwidth);
#   one GRPO step (benchmarks/rl_step.py), P=64 x G=8, prompt 32 + 64 new: the update's MFU
#     (update_mfu) and its rate against an 8192^2 bf16 matmul in the same process.
# Each benchmark runs under its own time limit in seconds (the second argument of `bench`, times
# SCALE_T, default 1), so a slow or failing one still leaves the others' lines (a failed one
# writes none). SHAPE overrides the model shape (a CPU rehearsal: SHAPE of a small model).
# Run from the repository root:  OUT=/tmp/gpu bash benchmarks/gpu_check.sh
set -u
out=${OUT:-gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
shape=${SHAPE:---family=qwen2 --layers=24 --d_model=896 --heads=14 --kv_heads=2 --head_dim=64 \
--mlp_dim=4864 --vocab=151936 --dtype=bfloat16}

bench() {  # name, seconds, script and flags: one JSON line to results.jsonl, stderr's tail shown
  local name=$1 limit=$(( $2 * ${SCALE_T:-1} ))
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$py" "$@" 2>"$out/$name.err" | grep '^{' | tail -1 | tee -a "$out/results.jsonl"
  echo "# $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
  grep -v "^I0000\|^W0000" "$out/$name.err" | tail -4
}

"$py" -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax',
flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tail -2
bench decode_64 110 benchmarks/decode.py $shape --batch=64 --repeats=5 --bandwidth_mb=2048
bench rl_step 230 benchmarks/rl_step.py $shape --matmul=8192 --steps=3
bench decode_256 100 benchmarks/decode.py $shape --batch=256 --repeats=5 --bandwidth_mb=0
bench decode_long 100 benchmarks/decode.py $shape --batch=64 --prompt_len=128 --new_tokens=512 \
  --repeats=3 --bandwidth_mb=0
