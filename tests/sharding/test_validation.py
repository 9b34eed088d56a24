"""A mesh that does not divide what it shards fails early and says why (issue 3, check 5).

"Early" means before any compile or transfer: a mistyped mesh on a TPU pod should cost a second,
not a multi-minute compile followed by an XLA error about shard shapes.
"""
import jax
import pytest

from sharding_tiny import tiny_inputs, tiny_models
from specdec_jax import sharding as sh
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model


class _CompileSpy:
  """Counts XLA compiles (jax.monitoring events) while active. The backend-compile event also
  fires when the persistent compilation cache (tests/conftest.py) hands a program back, so a
  program loaded from the cache counts too."""

  def __enter__(self):
    self.count = 0
    def listener(event, duration, **_):
      if "backend_compile" in event:
        self.count += 1
    self._listener = listener
    jax.monitoring.register_event_duration_secs_listener(listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)


def test_heads_not_divisible_names_axis_and_sizes():
  target = Model(get_preset("t5_test_target"))  # 4 heads
  with _CompileSpy() as spy, pytest.raises(ValueError) as e:
    sh.shard_models(target, None, mesh_config=sh.MeshConfig(1, 1, 8))
  msg = str(e.value)
  for part in ("model_inner", "8", "'heads'", "4", "target"):
    assert part in msg, msg
  assert spy.count == 0


def test_draft_on_inner_axis_is_checked_separately():
  t = Model(get_preset("t5_test_target", num_heads=8))
  d = Model(get_preset("t5_test_draft"))  # 2 heads: fits inner=2, not inner=4
  sh.validate(sh.make_mesh(sh.MeshConfig(1, 4, 2)), d, sh.MeshConfig().rules_for("draft"),
              name="draft")
  with pytest.raises(ValueError, match=r"model_inner.*size 4.*draft dimension 'heads' = 2"):
    sh.shard_models(t, None, d, None, mesh_config=sh.MeshConfig(1, 2, 4))


def test_vocab_not_divisible():
  t = Model(get_preset("t5_test_target", num_heads=8, vocab_size=60, mlp_dim=64))
  with pytest.raises(ValueError, match=r"size 8 \(model_outer=2 x model_inner=4\).*'vocab' = 60"):
    sh.shard_models(t, None, mesh_config=sh.MeshConfig(1, 2, 4))


def test_batch_not_divisible_by_data_raises_before_compile():
  t, tp, d, dp = tiny_models()
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(8, 1, 1))
  with _CompileSpy() as spy, pytest.raises(ValueError, match=r"data.*size 8.*batch size = 6"):
    decoder = Decoder(p.target, p.draft, Chain(2), SamplingConfig(), max_decode_len=4,
                      mesh=p.mesh)
    decoder.generate(Params(p.target_params, p.draft_params), tiny_inputs(batch=6))
  assert spy.count == 0


def test_mesh_shape_must_match_devices():
  with pytest.raises(ValueError, match="has 12 devices, but 8"):
    sh.make_mesh(sh.MeshConfig(3, 2, 2))
  with pytest.raises(ValueError, match="does not exist"):
    t = Model(get_preset("t5_test_target"))
    sh.validate(sh.make_mesh(sh.MeshConfig(1, 1, 8)), t, (("heads", "model"),))
