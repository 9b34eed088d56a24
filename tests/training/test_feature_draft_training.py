"""Training a feature-level draft on its frozen target (`training/feature_trainer.py`).

Why each test: (1) the rolled-out layout must give each drafted entry exactly the attention
inference gives it (a leak from later target entries would train on what drafting never has);
(2) a few steps on a tiny preset must lower the loss and leave the target and the copied pieces
untouched; (3) a killed run must resume to the same weights, with the block loss on too; (4) the
export must round-trip, name its target (another target is refused) and record its block size
and mask token.
"""
import json

import jax
import numpy as np
import pytest

from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
from specdec_jax.checkpoints import load_checkpoint, orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training import feature_step as fstep
from specdec_jax.training import feature_trainer as fdt


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("feature_train")
  lines = [{"en": f"The cat number {i} sat on mat {i % 7}.", "de": f"Die Katze {i} sass."}
           for i in range(40)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  cfg = get_preset("t5_test_target", vocab_size=8192)
  target_dir = str(root / "target")
  orbax_io.save(target_dir, cfg, load_checkpoint("t5_test_target", config=cfg, seed=3)[1])
  return root, str(task), target_dir


def _config(task, target, **kw):
  spec = data_lib.TaskSpec(name=task, input_len=24, target_len=12)
  base = dict(target=target, tasks=[spec], max_steps=8, batch_size=8, checkpoint_every=4,
              log_every=1, learning_rate=3e-3, emb_dim=16, num_heads=2, mlp_dim=32, ttt_steps=1,
              export_dtype=None)
  return fdt.FeatureTrainConfig(**{**base, **kw})


def test_rollout_layout_is_inference_attention():
  offsets, visible = fstep.rollout_layout(4, 3)
  assert offsets.tolist() == [0, 1, 2, 3] * 3
  # Step 0: causal over the target-fed entries.
  assert visible[:4, :4].tolist() == np.tril(np.ones((4, 4), bool)).tolist()
  assert not visible[:4, 4:].any()
  # Step 2, entry 3: target entries 0..1, step 1's entry 2, itself; nothing else.
  row = visible[2 * 4 + 3]
  assert np.flatnonzero(row).tolist() == [0, 1, 4 + 2, 8 + 3]
  # Step 1, entry 0: no target entry before it, only itself.
  assert np.flatnonzero(visible[4]).tolist() == [4]


@pytest.mark.slow  # ~20 s on 2 cores each; the model and scheme tests stay in the fast suite
@pytest.mark.parametrize("block_size", [0, 3])  # 3: with the block loss (feature_blocks.py)
def test_loss_falls_target_untouched_resume_and_export(setup, block_size):
  root, task, target = setup
  root = root / f"block{block_size}"
  straight, crashed = root / "straight", root / "crashed"
  export = str(root / "export")
  kw = dict(block_size=block_size)
  summary = fdt.train(_config(task, target, export_dir=export, **kw), str(straight))
  rows = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
  assert rows[-1]["loss"] < rows[0]["loss"] and {"kl_0", "kl_1", "top1_agree_1"} <= set(rows[0])
  assert ("block_kl_3" in rows[0]) == bool(block_size)
  assert summary["steps"] == 8
  with pytest.raises(RuntimeError, match="simulated crash"):
    fdt.train(_config(task, target, **kw), str(crashed), crash_after_step=5)
  fdt.train(_config(task, target, **kw), str(crashed))  # resumes from step 4
  a = _latest(straight)
  b = _latest(crashed)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  _, tp = load_checkpoint(target)
  with pytest.raises(ValueError, match="own weights only"):
    fd_ckpt.load(export)  # the target's pieces are not stored: they come from the target
  draft, params = fd_ckpt.load(export, tp)
  np.testing.assert_array_equal(params["logits_dense"]["kernel"],
                                np.asarray(tp["decoder"]["logits_dense"]["kernel"]))
  np.testing.assert_allclose(params["fuse"]["kernel"], np.asarray(a["fuse"]["kernel"]))
  assert draft.config.emb_dim == 16 and draft.config.feature_layers == (0, 1, 2)
  assert draft.config.block_size == block_size and draft.mask_id == 0  # recorded: the pad id
  fd_ckpt.check_target(export, target, tp)
  other = jax.tree.map(lambda x: np.asarray(x) + 1.0, tp)
  with pytest.raises(ValueError, match="other weights"):
    fd_ckpt.check_target(export, "another", other)


def _latest(out_dir):
  import orbax.checkpoint as ocp
  mgr = ocp.CheckpointManager(str(out_dir / "checkpoints"))
  return mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore())["params"]


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_start_entry_logits_equal_the_first_iterations_draft_call(kind):
  """The start-entry loss trains the entry the feature chain's first iteration drafts from
  (count 0: zero feature, the start token or the prompt's last token, nothing else in the draft's
  cache): its training logits must be that call's, or the loss trains a call that never happens."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding import state as st  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.feature_entries import (  # pylint: disable=import-outside-toplevel
      FeatureCarry, feature_first_call)
  from specdec_jax.testing import tiny_feature_pair  # pylint: disable=import-outside-toplevel
  target, tp, draft, dp = tiny_feature_pair(kind, 64)
  rng = np.random.default_rng(0)
  dec = jnp.asarray(rng.integers(2, 64, (2, 6)).astype(np.int32))
  enc = jnp.asarray(rng.integers(2, 64, (2, 5)).astype(np.int32)) if kind == "t5" else \
      jnp.zeros((2, 1), jnp.int32)
  if kind == "t5":
    dec = dec.at[:, 0].set(0)
  encoded = target.encode(tp, enc) if kind == "t5" else None
  trained = fstep.start_entry_logits(draft, dp, enc, encoded, dec)
  assert trained.shape == ((2, 1, 64) if kind == "t5" else (2, 6, 64))
  gamma = 3
  for j in range(trained.shape[1]):  # the request's last known token is dec[:, j]
    cache = draft.prefill(dp, enc, 16, encoded=encoded)
    state = st.DecodeState(
        tokens_BxL=jnp.pad(dec, ((0, 0), (0, 10))), num_B=jnp.full((2,), j + 1),
        done_B=jnp.zeros(2, bool), base_B=cache.index_B - j, target_cache=None, rng=None,
        counters=None, draft_cache=cache.rollback(cache.index_B + j))
    carry = FeatureCarry(jnp.zeros((2, gamma + 1, draft.width), jnp.float32),
                         jnp.zeros((2,), jnp.int32))  # `FeatureDrafter.init_carry`: none pending
    logits, _, _ = feature_first_call(draft, dp, state, carry)
    np.testing.assert_allclose(np.asarray(trained[:, j]), np.asarray(logits), rtol=1e-5,
                               atol=1e-5, err_msg=f"{kind}, start token at {j}")


def test_init_from_starts_from_an_export(setup, tmp_path):
  """A second stage (`init_from`) starts from the first stage's export: with a negligible
  learning rate its one step leaves those weights, so its export equals the first's (and a
  fresh run's random init differs, so the check can fail); another target's draft is refused."""
  _, task, target = setup
  first = str(tmp_path / "first_export")
  fdt.train(_config(task, target, max_steps=2, export_dir=first), str(tmp_path / "first"))
  frozen = dict(max_steps=1, learning_rate=1e-12, seed=1)
  second, fresh = str(tmp_path / "second_export"), str(tmp_path / "fresh_export")
  fdt.train(_config(task, target, init_from=first, export_dir=second, ttt_steps=2, **frozen),
            str(tmp_path / "second"))
  fdt.train(_config(task, target, export_dir=fresh, **frozen), str(tmp_path / "fresh"))
  _, tp = load_checkpoint(target)
  a, b, c = (fd_ckpt.load(d, tp)[1] for d in (first, second, fresh))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-8), a, b)
  assert not np.allclose(a["layer"]["mlp"]["wi_0"]["kernel"],
                            c["layer"]["mlp"]["wi_0"]["kernel"])
  other = get_preset("t5_test_target", vocab_size=8192)
  other_dir = str(tmp_path / "other_target")
  orbax_io.save(other_dir, other, load_checkpoint("t5_test_target", config=other, seed=4)[1])
  with pytest.raises(ValueError, match="trained on the states of"):
    fdt.train(_config(task, other_dir, init_from=first, **frozen), str(tmp_path / "other"))


def test_resume_refuses_another_loss_and_logs_another_rate(setup, tmp_path):
  """A feature draft's run key (`run_key.FEATURE_STRICT`): resuming with another number of
  rolled-out steps would continue another loss, so it is refused before any step; another
  learning rate is a common change and resumes."""
  _, task, target = setup
  out = tmp_path / "run"
  with pytest.raises(RuntimeError, match="simulated crash"):
    fdt.train(_config(task, target, max_steps=5), str(out), crash_after_step=4)  # saved at 4
  key = json.loads((out / "run_key.json").read_text())
  assert key["ttt_steps"] == 1 and key["target"] == target
  with pytest.raises(ValueError, match=r"different \['ttt_steps'\]"):
    fdt.train(_config(task, target, max_steps=5, ttt_steps=2), str(out))
  assert fdt.train(_config(task, target, max_steps=5, learning_rate=1e-3), str(out))["steps"] == 5
