"""Tests of the digest and JSON helpers against digests computed here with hashlib and json directly."""
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from stimsim.utilities.hashing import canonical_json, json_sha256, sha256_of, state_sha256, tensor_sha256
from stimsim.utilities.jsonable import json_ready, json_value


def test_file_and_record_digests_match_hashlib(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 3_000_001)
    assert sha256_of(path, chunk_bytes=1000) == hashlib.sha256(b"x" * 3_000_001).hexdigest()
    record = {"b": [1, 2.5], "a": "text"}
    assert json_sha256(record) == hashlib.sha256(b'{"a": "text", "b": [1, 2.5]}').hexdigest()
    assert canonical_json({"x": np.float32(0.5), "y": np.arange(2), "z": Path("p")}) == '{"x": 0.5, "y": [0, 1], "z": "p"}'


def test_state_digest_covers_names_shapes_dtypes_and_bytes_in_name_order():
    state = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([3], dtype=torch.int64)}
    expected = hashlib.sha256()
    expected.update(b"b:(1,):torch.int64" + np.array([3], dtype="<i8").tobytes())
    expected.update(b"w:(2,):torch.float32" + np.array([1.0, -2.0], dtype="<f4").tobytes())
    assert state_sha256(state) == expected.hexdigest()
    assert state_sha256({"w": torch.tensor([1.0, -2.0], dtype=torch.float64), "b": state["b"]}) != expected.hexdigest()
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    plain = hashlib.sha256(b"(2, 3):torch.float32" + np.arange(6, dtype="<f4").tobytes()).hexdigest()
    assert tensor_sha256(tensor) == plain and tensor_sha256(tensor.t()) != plain


def test_json_ready_gives_strict_json():
    value = {1: (np.int32(4), np.float64(np.nan)), "a": np.array([[1.0, np.inf]]), "p": Path("/x"),
             "ok": [np.bool_(True), -math.inf, "s"]}
    ready = json_ready(value)
    assert ready == {"1": [4, None], "a": [[1.0, None]], "p": "/x", "ok": [True, None, "s"]}
    json.dumps(ready, allow_nan=False)
    assert type(ready["1"][0]) is int and type(ready["ok"][0]) is bool
    assert json_value(np.float32(1.5)) == 1.5
