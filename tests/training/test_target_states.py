"""Offline feature-draft training: stored target states and a restricted training head.

Why each test: (1) a step fed stored states (whole, or zero after each row's end as a cut fill
stores them), or a batch cut to its longest row, must compute the loss a step running the target
computes (the teacher through the copied final norm and head is the target's own logits; a
wrong layer or norm would train on another distribution and nothing else would notice), with the
full head and with a restricted one, on an untied and a tied (SmolLM2-like) target; (2) the
restricted head's columns are exactly the full head's at those ids; (3) a killed fill resumes
without recomputing or losing a row, a store of other data is refused by name, a partial store
is never read, and a second writer is refused; (3b) the fill's shortest-first, cut batches store
at every real position what a full-width pass computes, zeros after a row's end, and refuse to
resume a partial store of another order; (4) the trainer end to end: offline and online
steps give the same weights, and the export carries the ranking it trained on.
"""
import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import lock
from specdec_jax.checkpoints import head_ranking, load_checkpoint, orbax_io
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models.model import Model
from specdec_jax.models.model_config import get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training import feature_step as fstep
from specdec_jax.training import feature_trainer as fdt
from specdec_jax.training import target_states


def _pair(preset: str, feature_layers=None, **overrides):
  """A tiny target whose final norm scale is not ones (a norm copied wrong would show) and a
  feature draft on it."""
  target = Model(get_preset(preset, vocab_size=64, **overrides))
  tp = target.init(jax.random.key(0))
  norm = tp["decoder"]["decoder_norm"]
  scale = 1.0 + 0.5 * jax.random.normal(jax.random.key(5), norm["scale"].shape)
  tp = {**tp, "decoder": {**tp["decoder"], "decoder_norm": {**norm, "scale": scale}}}
  sizes = dict(emb_dim=16, num_heads=2, mlp_dim=32)
  if feature_layers is not None:
    sizes["feature_layers"] = feature_layers
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, **sizes))
  return target, tp, draft, draft.with_target_pieces(draft.init(jax.random.key(1)), tp)


def _batch(seed=0, b=3, t=9, pad_all=False):
  rng = np.random.default_rng(seed)
  seq = rng.integers(2, 64, (b, t + 1)).astype(np.int32)
  seq[0, -3:] = 0  # padding at the end of one row
  if pad_all:  # of every row: a batch `data.cut_batch` cuts
    seq[1:, -2:] = 0
  task = data_lib.TokenizedTask(data_lib.TaskSpec(name="x", input_len=0, target_len=t + 1),
                                None, seq)
  return data_lib.batch_of(task, np.arange(b))


@pytest.mark.parametrize("preset,tied,head_k,layers", [("decoder_test_target", False, 0, None),
                                                       ("llama_test_target", True, 0, None),
                                                       ("llama_test_target", True, 20, (0, 1))])
def test_a_step_on_stored_states_computes_the_target_steps_loss(preset, tied, head_k, layers):
  """(0, 1): the last layer is not a feature layer; the store appends it for the teacher."""
  target, tp, draft, dp = _pair(preset, layers, tie_embeddings=tied)
  if head_k:
    ids = tuple(range(3, 3 + head_k))
    draft, dp = draft.restrict_head(dp, ids)
  cfg = fdt.FeatureTrainConfig(target="t", tasks=[data_lib.TaskSpec(name="x")], max_steps=1,
                               ttt_steps=1, block_size=3)
  batch = _batch()
  loss = jax.jit(lambda p, t, b: fstep.draft_loss(draft, target, p, t, b, cfg))
  online = loss(dp, tp, batch)
  stored = target_states.stored_layers(draft.feature_layers, target.config.num_decoder_layers)
  assert len(stored) == len(draft.feature_layers) + (layers is not None)
  enc, dec = data_lib.model_inputs(batch)
  _, states = target.forward_with_hidden(tp, enc, dec, stored)
  offline = loss(dp, None, {**batch, fstep.STATES_KEY: states})
  # As a cut fill stores them: zeros after each row's last token (`target_states.fill_order`).
  _, lengths = target_states.fill_order(np.concatenate(
      [batch["decoder_input_tokens"], batch["decoder_target_tokens"][:, -1:]], axis=1))
  assert lengths.min() < states.shape[1]  # a row is cut
  cut = jnp.where((jnp.arange(states.shape[1])[None, :] < lengths[:, None])[..., None, None],
                  states, 0.0)
  zeroed = loss(dp, None, {**batch, fstep.STATES_KEY: cut})
  for key in online[1]:
    for got in (offline, zeroed):
      np.testing.assert_allclose(float(got[1][key]), float(online[1][key]), rtol=2e-5,
                                 atol=2e-6, err_msg=key)
  assert float(online[1]["kl_0"]) > 0.1  # an untrained draft: a loss that could differ
  # A batch cut to its longest row (`length_window`'s `data.cut_batch`) has the same loss.
  padded = _batch(pad_all=True)
  short = data_lib.cut_batch(padded, multiple=2)
  assert short["loss_weights"].shape[1] == 8 < padded["loss_weights"].shape[1]
  whole, cut_loss = loss(dp, tp, padded), loss(dp, tp, short)
  for key in whole[1]:
    np.testing.assert_allclose(float(cut_loss[1][key]), float(whole[1][key]), rtol=2e-5,
                               atol=2e-6, err_msg=key)


def test_a_restricted_heads_columns_are_the_full_heads():
  target, tp, draft, dp = _pair("llama_test_target", tie_embeddings=True)
  ids = (0, 5, 7, 63)
  small, sp = draft.restrict_head(dp, ids)
  out = jax.random.normal(jax.random.key(2), (2, 3, draft.width))
  full = draft.compact_logits(dp, out)
  np.testing.assert_allclose(np.asarray(small.compact_logits(sp, out)),
                             np.asarray(full)[..., list(ids)], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(draft.logits(dp, out)), np.asarray(full))
  # The teacher from a last-layer state is the target's own next-token logits.
  batch = _batch()
  enc, dec = data_lib.model_inputs(batch)
  logits, states = target.forward_with_hidden(tp, enc, dec, (target.config.num_decoder_layers,))
  np.testing.assert_allclose(np.asarray(draft.target_logits(dp, states[:, :, 0])),
                             np.asarray(logits), rtol=1e-5, atol=1e-5)


def _tasks():
  rng = np.random.default_rng(1)
  out = []
  for name, rows in (("a", 7), ("b", 5)):
    spec = data_lib.TaskSpec(name=name, input_len=0, target_len=6)
    out.append(data_lib.TokenizedTask(spec, None, rng.integers(1, 50, (rows, 6)).astype(np.int32)))
  return out


def _states_fn(calls):
  def fn(dec_BxT):
    calls.append(dec_BxT.copy())
    x = dec_BxT.astype(np.float32)[:, :, None, None]
    return np.broadcast_to(x * np.arange(1, 3, dtype=np.float32)[None, None, :, None],
                           dec_BxT.shape + (2, 4)) + np.arange(4, dtype=np.float32)
  return fn


def test_a_killed_fill_resumes_without_losing_or_repeating_a_row(tmp_path):
  tasks = _tasks()
  meta = target_states.describe("target", "d0", (1, 2), tasks, 4)
  straight = target_states.fill(str(tmp_path / "straight"), meta, tasks, _states_fn([]), 3)
  calls, fn = [], _states_fn([])

  def dies_on_third(dec_BxT):
    if len(calls) == 2:
      raise KeyboardInterrupt("killed")
    calls.append(1)
    return fn(dec_BxT)

  killed = str(tmp_path / "killed")
  with pytest.raises(KeyboardInterrupt):
    target_states.fill(killed, meta, tasks, dies_on_third, 3)
  with pytest.raises(ValueError, match="has 6 of 7 rows"):
    target_states.open_store(killed, meta)  # a partial store is never read
  assert target_states.rows_to_fill(killed, meta) == 6
  resumed_calls = []
  resumed = target_states.fill(killed, meta, tasks, _states_fn(resumed_calls), 3)
  assert sum(len(c) for c in resumed_calls) == 6  # the missing rows, each once
  for a, b in zip(straight, resumed):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert straight[0].shape == (7, 5, 2, 4) and not straight[0].flags.writeable


def test_a_store_of_other_data_or_a_second_writer_is_refused(tmp_path):
  tasks = _tasks()
  directory = str(tmp_path / "s")
  meta = target_states.describe("target", "d0", (1, 2), tasks, 4)
  target_states.fill(directory, meta, tasks, _states_fn([]), 3)
  changed = [tasks[0], data_lib.TokenizedTask(tasks[1].spec, None, tasks[1].targets_NxL + 1)]
  with pytest.raises(ValueError, match="another tasks"):
    target_states.open_store(directory, target_states.describe("target", "d0", (1, 2), changed, 4))
  with pytest.raises(ValueError, match="another target_digest"):  # re-converted weights
    target_states.open_store(directory, target_states.describe("target", "d1", (1, 2), tasks, 4))
  with pytest.raises(ValueError, match="another layers"):
    target_states.fill(directory, target_states.describe("target", "d0", (1, 3), tasks, 4), tasks,
                       _states_fn([]), 3)
  (tmp_path / "s" / "meta.json").unlink()  # arrays of unknown data are never adopted
  with pytest.raises(ValueError, match="but no meta.json"):
    target_states.fill(directory, meta, tasks, _states_fn([]), 3)
  held, release = threading.Event(), threading.Event()

  def holder():
    with lock.hold(str(tmp_path / "busy"), "test"):
      held.set()
      release.wait(10)

  thread = threading.Thread(target=holder)
  thread.start()
  held.wait(10)
  try:  # flock is per open file description: a second open in this process conflicts too
    with pytest.raises(lock.DirectoryLocked):
      target_states.fill(str(tmp_path / "busy"), meta, tasks, _states_fn([]), 3)
  finally:
    release.set()
    thread.join()


def test_a_fill_cut_to_each_batchs_longest_row_stores_the_full_pass(tmp_path, monkeypatch):
  monkeypatch.setattr(data_lib, "CUT_MULTIPLE", 2)
  rng = np.random.default_rng(4)
  seq = rng.integers(1, 50, (7, 9)).astype(np.int32)
  lengths = np.array([9, 2, 5, 1, 7, 3, 4])  # tokens before the padding, in targets
  for row, n in enumerate(lengths):
    seq[row, n:] = 0
  seq[2, 1] = 0  # a pad id inside a row does not end it
  tasks = [data_lib.TokenizedTask(data_lib.TaskSpec(name="v", input_len=0, target_len=9), None,
                                  seq)]
  order, inputs = target_states.fill_order(seq)
  np.testing.assert_array_equal(inputs, np.minimum(np.maximum(lengths, 1), 8))
  np.testing.assert_array_equal(order, [3, 1, 5, 6, 2, 4, 0])
  meta = target_states.describe("target", "d0", (1, 2), tasks, 4)
  calls = []
  (stored,) = target_states.fill(str(tmp_path / "s"), meta, tasks, _states_fn(calls), 3)
  assert [c.shape[1] for c in calls] == [4, 8, 8]  # rows {3, 1, 5}: 3 -> 4; then up to 8 = T
  full = _states_fn([])(seq[:, :-1])
  for row in (0, 2, 4, 6):  # batches of full width
    np.testing.assert_array_equal(stored[row], full[row])
  for row in (1, 3, 5):  # the cut batch: its width computed, zeros after (no loss reads them)
    np.testing.assert_array_equal(stored[row, :4], full[row, :4])
    assert not stored[row, 4:].any()
  old = str(tmp_path / "old")
  target_states.fill(old, meta, tasks, _states_fn([]), 3)
  m = json.loads((tmp_path / "old" / "meta.json").read_text())
  del m["order"]  # a store from before the order was recorded, filled in row order
  (tmp_path / "old" / "meta.json").write_text(json.dumps(m))
  assert target_states.open_store(old, meta)[0].shape == (7, 8, 2, 4)  # full: either order
  (tmp_path / "old" / "progress.json").write_text("[3]")
  with pytest.raises(ValueError, match="partly filled in index order"):
    target_states.fill(old, meta, tasks, _states_fn([]), 3)


@pytest.fixture(scope="module")
def decoder_target(tmp_path_factory):
  root = tmp_path_factory.mktemp("offline")
  lines = [{"en": f"The cat number {i} sat on mat {i % 7}.", "de": f"Die Katze {i} sass."}
           for i in range(24)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  cfg = get_preset("llama_test_target", vocab_size=8192, tie_embeddings=True)
  target_dir = str(root / "target")
  orbax_io.save(target_dir, cfg, load_checkpoint("llama_test_target", config=cfg, seed=3)[1])
  return root, str(task), target_dir


@pytest.mark.parametrize("length_window", [0, 2])  # 2: length-sorted windows, batches cut
def test_offline_training_matches_online_and_exports_its_ranking(decoder_target, length_window,
                                                                 monkeypatch):
  root, task, target = decoder_target
  root = root / f"w{length_window}"
  monkeypatch.setattr(data_lib, "CUT_MULTIPLE", 4)  # widths these short rows are cut to
  widths, cut_batch = [], data_lib.cut_batch

  def cut_and_note(batch):
    out = cut_batch(batch)
    widths.append(out["decoder_input_tokens"].shape[1])
    return out

  monkeypatch.setattr(data_lib, "cut_batch", cut_and_note)
  spec = data_lib.TaskSpec(name=task, input_len=0, target_len=48)  # room after every row
  base = dict(target=target, tasks=[spec], max_steps=3, batch_size=8, checkpoint_every=3,
              log_every=1, learning_rate=3e-3, emb_dim=16, num_heads=2, mlp_dim=32,
              ttt_steps=1, export_dtype=None, head_vocab=40, export_dir="export",
              length_window=length_window)
  fdt.train(fdt.FeatureTrainConfig(**base), str(root / "online"))
  summary = fdt.train(fdt.FeatureTrainConfig(**base, target_states="states"),
                      str(root / "offline"))
  assert (root / "offline" / "states" / "task0.npy").exists()
  rows = [[json.loads(l) for l in (root / run / "metrics.jsonl").read_text().splitlines()]
          for run in ("online", "offline")]
  assert bool(length_window) == bool(widths) and all(w < 47 for w in widths), widths  # cut
  for a, b in zip(*rows):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4)
  a, b = (_latest(root / run) for run in ("online", "offline"))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-3,
                                                       atol=1e-5), a, b)
  ranking, _ = head_ranking.read_ranking(summary["export_dir"], 8192)
  assert len(ranking) == 8192 and ranking[0] != 0  # pad (0) is never counted
  # The mixture's ranking only: a run on any task restricts to the ids the draft trained on.
  for task_name in ("pairs", task, "translate_en_de"):
    np.testing.assert_array_equal(
        head_ranking.read_ranking(summary["export_dir"], 8192, task_name)[0], ranking)


def _latest(out_dir):
  import orbax.checkpoint as ocp
  mgr = ocp.CheckpointManager(str(out_dir / "checkpoints"))
  return mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore())["params"]
