"""A small GSM8K-style prompt set written by rlscale/data/gsm8k_style/make.py (not downloaded):
train.jsonl and test.jsonl with "question" and "answer" ("worked solution ... #### N"), for the
files task (task.name="files") on a laptop and in tests."""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(FOLDER, "train.jsonl")
TEST = os.path.join(FOLDER, "test.jsonl")
