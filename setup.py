"""rlscale: batch-size scaling laws for reinforcement learning of language models, in JAX."""

from setuptools import find_packages, setup

setup(
    name="rlscale",
    version="0.1.0",
    description="Batch-size scaling for GRPO and PPO on language models, in JAX",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # The experiment configs stay in the checkout's configs/ (one copy) and install as
    # rlscale.configs, so `rlscale --config=configs/grpo.py` works from any directory.
    packages=find_packages(include=["rlscale", "rlscale.*", "analysis", "analysis.*"]) + ["rlscale.configs"],
    package_dir={"rlscale.configs": "configs"},
    # The GSM8K-style prompts of grpo_math.py; the throughput model's accelerator and
    # published-scaling tables.
    package_data={"rlscale.data.gsm8k_style": ["*.jsonl"], "analysis.throughput": ["*.json"]},
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "ml-collections>=1.1.0",
        "absl-py>=2.1",
        "numpy>=2.0",
        "ml_dtypes>=0.5",  # bfloat16 in numpy, for safetensors checkpoints
        "tokenizers>=0.21",  # tokenizer.json of Hugging Face checkpoints
        "jinja2>=3.1",  # chat templates of Hugging Face checkpoints
        # Prompt files: JSONL, Parquet and save_to_disk folders as memory-mapped Arrow tables,
        # one reader for the three formats (rlscale/tasks/files.py).
        "datasets>=3.0",
        # Math answers compared as the community does (boxed and final-line answers, numeric and
        # symbolic equivalence through sympy), with a time limit per check (tasks/graders.py).
        "math-verify>=0.8",
        # task.grader='regex': the user's pattern with a time limit per search, which Python's
        # re cannot interrupt (rlscale/tasks/graders.py).
        "regex>=2022.1.18",
        "tensorboardX>=2.6",  # TensorBoard event files without TensorFlow
        # analysis/: tables, figures and fits of a sweep's report (analysis/report.py).
        "pandas>=2.2",
        "matplotlib>=3.8",
        "scipy>=1.11",
    ],
    entry_points={"console_scripts": [
        "rlscale = rlscale.run.main:run",  # = python -m rlscale
        "rlscale-report = analysis.report:main",  # = python -m analysis.report
    ]},
    extras_require={
        # safetensors: a cross-check; wheel: the packaging test builds a wheel without build
        # isolation, and a venv's setuptools before 70.1 has no bdist_wheel of its own.
        # pytest < 9: pytest-xdist 3.8 groups tests by rewriting item._nodeid, which pytest 9
        # no longer reads (tests/conftest.py refuses to run when the groups are lost).
        "test": ["pytest>=8,<9", "pytest-xdist>=3.6", "tensorflow-datasets>=4.9", "safetensors>=0.4", "wheel>=0.41"],
        # TFDS math_dataset through tfds.data_source (no TensorFlow needed).
        "tfds": ["tensorflow-datasets>=4.9"],
        # Procedural problems from reasoning-gym's generators.
        "reasoning": ["reasoning-gym>=0.1.25"],
        # launch/sweep.py --launcher=xm: XManager (about 600 MB with its Google Cloud clients).
        "xm": ["xmanager>=0.8.5"],
        # The reference implementation for the parity tests; the CPU wheel of torch.
        "hf": ["torch==2.13.0", "transformers>=4.56"],
    },
)
