"""Shared tiny models and compiled sharded decodes for tests/sharding (compiles are the cost).

The tiny presets get 8 heads (target head_dim 4, draft head_dim 2) so every layout below divides
them, and EOS moved to an id these random models rarely pick, so outputs run long enough to
compare many tokens. Each (layout, temperature) program is compiled once per session and shared
by the equivalence and HLO tests.
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after XLA_FLAGS on purpose; tests/conftest.py does the same)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from specdec_jax import sharding as sh  # noqa: E402
from specdec_jax.decoding import speculative as spec  # noqa: E402
from specdec_jax.decoding.sampling import SamplingConfig  # noqa: E402
from specdec_jax.models.config import get_preset  # noqa: E402
from specdec_jax.models.model import Model  # noqa: E402

GAMMA, MAX_LEN, BATCH = 3, 12, 8
# (data, model_outer, model_inner). Target model-parallel = outer * inner; draft = inner.
LAYOUTS = {
    "dp1_mp8": (1, 1, 8),
    "dp2_mp4": (2, 1, 4),
    "dp8_mp1": (8, 1, 1),
    "dp2_target4_draft2": (2, 2, 2),  # the draft on fewer chips than the target
}


def tiny_models(kind="t5", seed=0):
  target = Model(get_preset(f"{kind}_test_target", num_heads=8, head_dim=4, eos_id=63))
  draft = Model(get_preset(f"{kind}_test_draft", num_heads=8, head_dim=2, eos_id=63))
  k1, k2 = jax.random.split(jax.random.key(seed))
  return target, target.init(k1), draft, draft.init(k2)


def tiny_inputs(batch=BATCH, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(3, 63, (batch, 6)).astype(np.int32)
  x[:, -1] = 1
  x[1, 3:] = 0  # ragged prompts: right padding
  x[5, 2:] = 0
  return x


def sampling_for(temperature):
  return SamplingConfig(temperature=temperature)


class Runs:
  """Lazily compiled and cached decodes: the unsharded reference and each sharded layout."""

  def __init__(self):
    self.models = tiny_models()
    self.inputs = tiny_inputs()
    self.rng = jax.random.key(1)
    self._ref, self._sharded = {}, {}

  def reference(self, temperature):
    if temperature not in self._ref:
      t, tp, d, dp = self.models
      self._ref[temperature] = jax.device_get(spec.generate_speculative(
          t, tp, d, dp, self.inputs, gamma=GAMMA, sampling=sampling_for(temperature),
          max_decode_len=MAX_LEN, rng=self.rng))
    return self._ref[temperature]

  def sharded(self, layout, temperature):
    """(ShardedModels, compiled executable, its result on host)."""
    key = (layout, temperature)
    if key not in self._sharded:
      t, tp, d, dp = self.models
      sm = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(*LAYOUTS[layout]),
                           batch_size=BATCH)
      lowered = sm.lower_speculative(self.inputs, self.rng, gamma=GAMMA,
                                     sampling=sampling_for(temperature), max_decode_len=MAX_LEN)
      compiled = lowered.compile()
      out = compiled(sm.target_params, sm.draft_params, sm.shard_inputs(self.inputs), self.rng)
      self._sharded[key] = (sm, compiled, out, jax.device_get(out))
    return self._sharded[key]


@pytest.fixture(scope="session")
def runs():
  return Runs()
