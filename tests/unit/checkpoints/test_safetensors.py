"""Our safetensors reader and writer: round trips, bfloat16, malformed files."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from rlscale.checkpoints import safetensors_io as st
from rlscale.checkpoints.safetensors_io import CheckpointError


def test_round_trip_every_dtype(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {
      "f32": rng.normal(size=(3, 4)).astype(np.float32),
      "bf16": rng.normal(size=(5,)).astype(ml_dtypes.bfloat16),
      "f16": rng.normal(size=(2, 2, 2)).astype(np.float16),
      "i64": np.arange(7, dtype=np.int64),
      "scalar": np.array(3.5, np.float32),
      "empty": np.zeros((0, 3), np.float32),
  }
  path = tmp_path / "x.safetensors"
  st.write(path, tensors, {"format": "pt"})
  f = st.SafetensorsFile(path)
  assert f.metadata == {"format": "pt"}
  assert sorted(f.keys()) == sorted(tensors)
  for name, a in tensors.items():
    got = f.get(name)
    assert got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_array_equal(got, a)


def test_reads_files_written_by_the_safetensors_library(tmp_path):
  from safetensors.numpy import save_file
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  save_file({"a": a}, str(tmp_path / "lib.safetensors"))
  np.testing.assert_array_equal(st.SafetensorsFile(tmp_path / "lib.safetensors").get("a"), a)


def _raw(path, header: bytes, data: bytes = b""):
  path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("header, data, match", [
    (b"{not json", b"", "not valid JSON"),
    (b"[1, 2]", b"", "not a JSON object"),
    (json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode(),
     b"\0" * 8, "do not fit"),
    (json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode(),
     b"\0" * 8, "do not fit"),
    (json.dumps({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}).encode(),
     b"\0" * 4, "malformed entry"),
])
def test_malformed_files_name_the_problem(tmp_path, header, data, match):
  path = tmp_path / "bad.safetensors"
  _raw(path, header, data)
  with pytest.raises(CheckpointError, match=match):
    st.SafetensorsFile(path)


def test_truncated_and_oversized_headers(tmp_path):
  short = tmp_path / "short.safetensors"
  short.write_bytes(b"\x01\x02")
  with pytest.raises(CheckpointError, match="too short"):
    st.SafetensorsFile(short)
  huge = tmp_path / "huge.safetensors"
  huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
  with pytest.raises(CheckpointError, match="exceeds the file"):
    st.SafetensorsFile(huge)


def test_folder_with_index_and_inconsistent_index(tmp_path):
  st.write(tmp_path / "a.safetensors", {"x": np.ones(2, np.float32)})
  st.write(tmp_path / "b.safetensors", {"y": np.zeros(3, np.float32)})
  index = {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  folder = st.SafetensorsFolder(tmp_path)
  assert sorted(folder.keys()) == ["x", "y"]
  np.testing.assert_array_equal(folder.get("y"), np.zeros(3))
  with pytest.raises(CheckpointError, match="no tensor 'z'"):
    folder.get("z")
  index["weight_map"]["y"] = "a.safetensors"
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(CheckpointError, match="lacks it|puts in"):
    st.SafetensorsFolder(tmp_path)
  index["weight_map"]["y"] = "missing.safetensors"
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(CheckpointError, match="missing"):
    st.SafetensorsFolder(tmp_path)


def test_folder_without_weights_refuses_pickles(tmp_path):
  (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not-loaded")
  with pytest.raises(CheckpointError, match="must be safetensors"):
    st.SafetensorsFolder(tmp_path)


def test_streaming_writer_checks_announced_shapes(tmp_path):
  with pytest.raises(ValueError, match="announced"):
    st.write_stream(tmp_path / "s.safetensors", [("a", (2,), np.float32)],
                    iter([np.ones(3, np.float32)]))
  assert not (tmp_path / "s.safetensors").exists()
