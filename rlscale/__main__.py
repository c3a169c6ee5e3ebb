"""`python -m rlscale --config=configs/grpo.py`: the same command line as `rlscale`."""

from rlscale.run.main import run

if __name__ == "__main__":
  run()
