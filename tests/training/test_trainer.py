"""The trainer resumes exactly after a crash, and its distillation loss is a proper KL."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints import load_checkpoint, orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training import losses
from specdec_jax.training import run_key
from specdec_jax.training.trainer import TrainConfig, learning_rate_schedule, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("trainer")
  lines = [{"en": f"The cat number {i} sat on mat {i % 7}.", "de": f"Die Katze {i} sass."}
           for i in range(40)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  cfg = get_preset("t5_test_draft", vocab_size=8192)
  model_dir = str(root / "init")
  orbax_io.save(model_dir, cfg, load_checkpoint("t5_test_draft", config=cfg, seed=3)[1])
  return root, str(task), model_dir


def _config(task, model, **kw):
  spec = data_lib.TaskSpec(name=task, input_len=24, target_len=16)
  base = dict(model=model, tasks=[spec], max_steps=6, batch_size=8, checkpoint_every=2,
              log_every=1, eval_examples=0, export_dir=None, learning_rate=0.05)
  return TrainConfig(**{**base, **kw})


def _final_params(out_dir):
  import orbax.checkpoint as ocp
  mgr = ocp.CheckpointManager(str(out_dir / "checkpoints"))
  state = mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore())
  return mgr.latest_step(), state["params"]


def _digests(out_dir):
  rows = [json.loads(l) for l in (out_dir / "batches.jsonl").read_text().splitlines()]
  return {r["step"]: r["digest"] for r in rows}, [r["step"] for r in rows]


def test_crash_and_resume_equals_uninterrupted(setup):
  root, task, model = setup
  straight, crashed = root / "straight", root / "crashed"
  train(_config(task, model), str(straight), progress=False)
  with pytest.raises(RuntimeError, match="simulated crash"):
    train(_config(task, model), str(crashed), crash_after_step=3, progress=False)
  summary = train(_config(task, model), str(crashed), progress=False)  # resumes from step 2

  assert summary["steps"] == 6
  step_a, params_a = _final_params(straight)
  step_b, params_b = _final_params(crashed)
  assert step_a == step_b == 6
  for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  digests_a, _ = _digests(straight)
  digests_b, steps_b = _digests(crashed)
  # Batch 2 (the third step) ran, was lost with the crash (last checkpoint: step 2), and ran again.
  assert steps_b == [0, 1, 2, 2, 3, 4, 5]
  assert digests_a == digests_b  # the same data order, batch for batch


def test_resume_refuses_other_data_or_teacher(setup, tmp_path, monkeypatch):
  """A resumed run must see the same batches and loss: a changed seed or a teacher re-exported to
  the same path refuses; a longer max_steps or another learning rate resumes."""
  root, task, model = setup
  out = tmp_path / "run"
  teacher = tmp_path / "teacher"
  train(_config(task, model, max_steps=2, export_dir=str(teacher)), str(tmp_path / "t"),
        progress=False)
  train(_config(task, model, max_steps=2, teacher=str(teacher)), str(out), progress=False)
  key = json.loads((out / "run_key.json").read_text())
  assert key["seed"] == 0 and key["teacher_contents"]
  # A task setting added later (loss_on) is in the key only when not its default, so keys
  # written before it still match; another value is another loss and refuses.
  assert "loss_on" not in key["tasks"][0]
  other = _config(task, model, max_steps=4, teacher=str(teacher))
  other = dataclasses.replace(other, tasks=[dataclasses.replace(other.tasks[0],
                                                                loss_on="continuation")])
  assert run_key.run_key(other)["tasks"][0]["loss_on"] == "continuation"
  with pytest.raises(ValueError, match=r"different \['seed'\]"):
    train(_config(task, model, max_steps=4, teacher=str(teacher), seed=1), str(out), progress=False)
  warnings = []
  monkeypatch.setattr(run_key.logging, "warning", lambda *a: warnings.append(a[0] % a[1:]))
  summary = train(_config(task, model, max_steps=4, teacher=str(teacher), learning_rate=0.01),
                  str(out), progress=False)
  assert summary["steps"] == 4
  assert any("learning_rate = 0.01 (was 0.05)" in w for w in warnings), warnings
  # A sidecar that leaves the teacher's weights alone (a head ranking) is not a new teacher, and a
  # cool-down added to a resumed run (schedule 'wsd') is a tolerated change.
  (teacher / "head_ranking.json").write_text("{}")
  summary = train(_config(task, model, max_steps=5, teacher=str(teacher), learning_rate=0.01,
                          schedule="wsd", decay_steps=1), str(out), progress=False)
  assert summary["steps"] == 5
  assert any("schedule = 'wsd' (was 'constant')" in w for w in warnings), warnings
  # The teacher retrained (another seed) and exported to the same path.
  train(_config(task, model, max_steps=2, seed=1, export_dir=str(teacher)), str(tmp_path / "t2"),
        progress=False)
  with pytest.raises(ValueError, match="teacher_contents"):
    train(_config(task, model, max_steps=6, teacher=str(teacher)), str(out), progress=False)


def test_batch_order_is_a_pure_function_of_step():
  rng = np.random.default_rng(0)
  spec_a, spec_b = data_lib.TaskSpec("a", weight=3), data_lib.TaskSpec("b", weight=1)
  tasks = [data_lib.TokenizedTask(spec_a, rng.integers(1, 9, (50, 5)), rng.integers(1, 9, (50, 4))),
           data_lib.TokenizedTask(spec_b, rng.integers(1, 9, (30, 5)), rng.integers(1, 9, (30, 4)))]
  seq = [data_lib.batch_at(tasks, s, 8, seed=1) for s in range(40)]
  assert [t for t, _ in seq[:8]] == [0, 0, 0, 1, 0, 0, 0, 1]
  again = data_lib.batch_at(tasks, 37, 8, seed=1)
  np.testing.assert_array_equal(again[1]["decoder_target_tokens"], seq[37][1]["decoder_target_tokens"])
  # Within an epoch no example repeats: task b serves 3 batches of 8 from 30 rows per epoch.
  rows_b = [b["encoder_input_tokens"] for t, b in seq[:12] if t == 1]
  assert len({r.tobytes() for b in rows_b for r in b}) == 24 or len(rows_b) < 3
  # Shift right with BOS 0 for T5.
  b = seq[0][1]
  np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:], b["decoder_target_tokens"][:, :-1])
  assert (b["decoder_input_tokens"][:, 0] == 0).all()


def test_length_windows_serve_each_epochs_rows_once_sorted_and_cut():
  """`length_window`: an epoch serves the rows it serves without windows, each once; a batch is
  a run of its window's length order; the order is still a pure function of the step; a cut
  batch keeps every weighted position and cuts only decoder arrays."""
  rng = np.random.default_rng(2)
  seq = rng.integers(1, 9, (45, 40)).astype(np.int32)
  lengths = rng.integers(3, 41, 45)
  for row, n in enumerate(lengths):
    seq[row, n:] = 0
  task = data_lib.TokenizedTask(data_lib.TaskSpec("c", input_len=0, target_len=40), None, seq)
  per_epoch = 45 // 4  # 11 batches of 4: 44 rows an epoch, windows of 3 batches (the last of 2)
  for epoch in range(2):
    steps = range(epoch * per_epoch, (epoch + 1) * per_epoch)
    plain = [data_lib.rows_at([task], s, 4, seed=3)[1] for s in steps]
    windowed = [data_lib.rows_at([task], s, 4, seed=3, length_window=3)[1] for s in steps]
    assert sorted(np.concatenate(windowed)) == sorted(np.concatenate(plain))  # once each
    assert len(set(np.concatenate(windowed))) == 44
    for w in range(4):  # a window's batches partition its rows into runs of their length order
      rows = np.concatenate(plain[3 * w:3 * w + 3])
      ranked = rows[np.argsort(data_lib.row_lengths(seq[rows]), kind="stable")]
      runs = {tuple(ranked[i:i + 4]) for i in range(0, len(ranked), 4)}
      assert {tuple(b) for b in windowed[3 * w:3 * w + 3]} == runs
  assert any(not np.array_equal(a, b) for a, b in zip(  # served in a seeded order, not sorted
      windowed[:3], sorted(windowed[:3], key=lambda b: data_lib.row_lengths(seq[b]).max())))
  np.testing.assert_array_equal(  # any step alone (a resumed run) gets the same rows
      data_lib.rows_at([task], per_epoch + 7, 4, seed=3, length_window=3)[1], windowed[7])
  for multiple in (1, 8):  # 1: a cut exactly at the last weighted position
    for rows in windowed:
      batch = data_lib.batch_of(task, rows)
      cut = data_lib.cut_batch(batch, multiple=multiple)
      last = int(np.flatnonzero(batch["loss_weights"].any(axis=0))[-1]) + 1
      assert cut["loss_weights"].shape[1] == min(39, -(-last // multiple) * multiple)
      assert cut["loss_weights"].sum() == batch["loss_weights"].sum()  # nothing weighted is cut
      np.testing.assert_array_equal(cut["decoder_input_tokens"],
                                    batch["decoder_input_tokens"][:, :cut["loss_weights"].shape[1]])
  assert min(data_lib.cut_batch(data_lib.batch_of(task, r), multiple=8)["loss_weights"].shape[1]
             for r in windowed) <= 16  # some batches are cut short
  t5 = {"encoder_input_tokens": np.ones((2, 5)), "loss_weights": np.array([[1, 1, 1, 0, 0]] * 2)}
  assert data_lib.cut_batch(t5, multiple=1)["encoder_input_tokens"].shape == (2, 5)
  assert data_lib.cut_batch(t5, multiple=1)["loss_weights"].shape == (2, 3)
  # Each batch's share of its window's tokens: they average 1 over a window, so a token weighs
  # the same in every batch of it (a loss averaged over the batch's own tokens, times the share).
  shares = [data_lib.batch_share([task], s, 4, seed=3, length_window=3) for s in range(11)]
  counts = [data_lib.batch_of(task, r)["loss_weights"].sum() for r in
            [data_lib.rows_at([task], s, 4, seed=3, length_window=3)[1] for s in range(11)]]
  for w in range(4):
    part = slice(3 * w, 3 * w + 3)
    np.testing.assert_allclose(np.mean(shares[part]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.array(shares[part]) / np.array(counts[part]),
                               1.0 / np.mean(counts[part]), rtol=1e-6)
  assert max(shares) / min(shares) > 1.5  # windows make unequal batches: the scale matters
  assert data_lib.batch_share([task], 5, 4, seed=3, length_window=0) == 1.0


def test_forward_kl_is_zero_for_equal_and_positive_otherwise():
  key = jax.random.key(0)
  logits = jax.random.normal(key, (2, 3, 11))
  w = jnp.ones((2, 3))
  assert abs(float(losses.forward_kl(logits, logits, w))) < 1e-5
  other = jax.random.normal(jax.random.key(1), (2, 3, 11))
  p = jax.nn.softmax(other)
  expected = jnp.sum(p * (jnp.log(p) - jax.nn.log_softmax(logits)))
  np.testing.assert_allclose(float(losses.forward_kl(logits, other, w)), float(expected), rtol=1e-5)
  # The teacher gets no gradient.
  g = jax.grad(lambda t: losses.forward_kl(logits, t, w))(other)
  assert float(jnp.abs(g).max()) == 0.0


def test_distillation_from_itself_starts_at_zero_kl(setup):
  root, task, model = setup
  out = root / "distill"
  summary = train(_config(task, model, teacher=model, max_steps=1, checkpoint_every=1),
                  str(out), progress=False)
  assert summary["final_train_metrics"]["train/kl"] < 1e-4


def test_wsd_schedule_is_stable_then_cools_down_to_zero():
  """Warm-up, the constant rate, then lr * (1 - sqrt(progress)) over the last decay_steps."""
  cfg = _config("a", "m", max_steps=100, schedule="wsd", warmup_steps=10, decay_steps=40)
  lr = learning_rate_schedule(cfg)
  got = np.array([float(lr(s)) for s in (0, 5, 10, 59, 60, 70, 90, 100, 120)])
  want = 0.05 * np.array([0, 0.5, 1, 1, 1, 1 - np.sqrt(0.25), 1 - np.sqrt(0.75), 0, 0])
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  with pytest.raises(ValueError, match="decay_steps"):
    _config("a", "m", max_steps=100, schedule="wsd", decay_steps=0)
  with pytest.raises(ValueError, match="decay_steps"):
    _config("a", "m", max_steps=100, schedule="wsd", warmup_steps=10, decay_steps=91)


def test_bad_config_errors():
  with pytest.raises(ValueError, match="unknown optimizer 'sgdd'"):
    TrainConfig(model="m", tasks=[data_lib.TaskSpec("a")], max_steps=1, optimizer="sgdd")
  with pytest.raises(ValueError, match="distill_weight"):
    TrainConfig(model="m", tasks=[data_lib.TaskSpec("a")], max_steps=1, distill_weight=2.0)


def test_periodic_validation_goes_to_tensorboard(setup, tmp_path):
  """eval_every writes valid/<task> every N steps (and the final one), from one compiled loss."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  root, task, model = setup
  summary = train(_config(task, model, eval_examples=8, eval_every=2), str(tmp_path),
                  progress=False)
  acc = EventAccumulator(str(tmp_path / "tensorboard"))
  acc.Reload()
  tags = [t for t in acc.Tags()["scalars"] if t.startswith("valid/")]
  assert len(tags) == 1
  events = acc.Scalars(tags[0])
  assert [e.step for e in events] == [2, 4, 6]
  final = next(iter(summary["valid_cross_entropy"].values()))
  assert events[-1].value == pytest.approx(final, rel=1e-6)
  assert events[0].value != pytest.approx(final, rel=1e-6)  # the model trained in between
  with pytest.raises(ValueError, match="eval_every"):
    _config(task, model, eval_every=-1)
