"""Sequences computed in float64 are the same with AVX2 and AVX-512 kernels; in float32 the Adam steps amplify the
kernels' float rounding. Each build runs in its own process, once with the kernels torch picks for this processor
and once held to AVX2 (ATen, oneDNN and MKL), as an AVX2 processor computes."""
import os
import subprocess
import sys

import numpy as np
import pytest

BUILD = """
import sys
import numpy as np
import torch
torch.set_num_threads(1)
from stimsim.data.stimuli import lfw_subset
from stimsim.models.registry import load_model
from stimsim.sequences import SequenceSpec, build_sequences
spec = SequenceSpec(n_sequences=2, iterations=25, learning_rate=0.05, recording_radius_mm=0.5, precision=sys.argv[1])
sites = np.array([[3.0, 3.0], [6.0, 6.5], [2.0, 7.0], [7.5, 2.5]])
sequences = build_sequences(load_model("stimsim-topo-s0"), sites, lfw_subset().images[::4], spec, progress=False)
np.save(sys.argv[2], sequences.images)
"""
AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}


def _images(precision: str, avx2: bool, path) -> np.ndarray:
    environment = {key: value for key, value in os.environ.items() if key not in AVX2_KERNELS}
    environment.update(AVX2_KERNELS if avx2 else {})
    subprocess.run([sys.executable, "-c", BUILD, precision, str(path)], env=environment, check=True)
    return np.load(path)


@pytest.mark.slow
def test_float64_sequences_are_the_same_with_avx2_and_avx512_kernels(tmp_path):
    single = {avx2: _images("float32", avx2, tmp_path / f"float32_{avx2}.npy") for avx2 in (False, True)}
    if np.array_equal(single[False], single[True]):
        pytest.skip("this processor's own kernels round as the AVX2 ones do (an AVX2 processor): nothing to compare")
    double = {avx2: _images("float64", avx2, tmp_path / f"float64_{avx2}.npy") for avx2 in (False, True)}
    assert np.array_equal(double[False], double[True])
    assert np.abs(single[False] - single[True]).max() > 1e-3  # in float32 the kernels' rounding grew into the images
