"""The sequence-level distillation data job: resumes after a kill with every example exactly once,
refuses to mix settings, and its output trains a draft against the teacher."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from specdec_jax.checkpoints import load_checkpoint, orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training import distill_data, seqdata
from specdec_jax.training.trainer import TrainConfig, train

N = 37  # 5 batches of 8, the last one short


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("generation")
  lines = [{"en": f"The cat number {i} sat on mat {i % 7}.", "de": f"Die Katze {i} sass."}
           for i in range(N)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  return root, str(task), _save_presets(root, "t5")


def _save_presets(root, kind):
  """{preset: checkpoint dir} of the `kind` test target (seed 1) and draft (seed 2), vocab 8192."""
  models = {}
  for name, seed in ((f"{kind}_test_target", 1), (f"{kind}_test_draft", 2)):
    cfg = get_preset(name, vocab_size=8192)
    models[name] = str(root / name)
    orbax_io.save(models[name], cfg, load_checkpoint(name, config=cfg, seed=seed)[1])
  return models


def _config(task, models, **kw):
  spec = data_lib.TaskSpec(name=task, input_len=24, target_len=12)
  base = dict(model=models["t5_test_target"], tasks=[spec], batch_size=8, temperature=1.0)
  return distill_data.DistillDataConfig(**{**base, **kw})


def _rows(out):
  path = out / "pairs" / seqdata.SEQUENCES
  return [json.loads(l) for l in path.read_text().splitlines()]


def test_killed_job_resumes_with_every_example_exactly_once(setup):
  root, task, models = setup
  straight, killed = root / "straight", root / "killed"
  summary = distill_data.generate(_config(task, models), str(straight))
  assert summary[task]["complete"] and summary[task]["examples_done"] == N
  with pytest.raises(RuntimeError, match="simulated crash after batch 2"):
    distill_data.generate(_config(task, models), str(killed), crash_after_batches=2)
  assert seqdata.read_index(str(killed / "pairs"))["examples_done"] == 16
  # A kill while the third batch was being written: a torn line past the indexed bytes.
  with open(killed / "pairs" / seqdata.SEQUENCES, "a", encoding="utf-8") as f:
    f.write('{"index": 16, "generator": "x", "input_ids": [5, 6')
  distill_data.generate(_config(task, models), str(killed))

  rows = _rows(killed)
  assert [r["index"] for r in rows] == list(range(N))  # each example once, in order
  assert (killed / "pairs" / seqdata.SEQUENCES).read_bytes() == (
      straight / "pairs" / seqdata.SEQUENCES).read_bytes()  # the lost batch regenerated exactly
  assert seqdata.content_digest(str(killed / "pairs")) == seqdata.content_digest(
      str(straight / "pairs"))
  # Sampled at T = 1 with 8k ids: outputs differ across examples and end with EOS or the limit.
  assert len({tuple(r["output_ids"]) for r in rows}) > N // 2
  assert all(r["output_ids"][-1] == 1 or len(r["output_ids"]) == 12 for r in rows)
  assert all(r["input_ids"][-1] == 1 and 0 not in r["input_ids"] for r in rows)
  # Running a finished job again changes nothing.
  distill_data.generate(_config(task, models), str(killed))
  assert [r["index"] for r in _rows(killed)] == list(range(N))


@pytest.mark.slow
def test_a_killed_process_resumes(setup, tmp_path):
  """A real SIGKILL of `python -m specdec_jax.distill_data` part-way, then the same command."""
  root, task, models = setup
  gin = tmp_path / "gen.gin"
  gin.write_text(
      f"DistillDataConfig.model = '{models['t5_test_target']}'\n"
      f"DistillDataConfig.tasks = [@TaskSpec()]\nTaskSpec.name = '{task}'\n"
      "TaskSpec.input_len = 24\nTaskSpec.target_len = 12\nDistillDataConfig.batch_size = 1\n")
  out = tmp_path / "out"
  cmd = [sys.executable, "-m", "specdec_jax.distill_data", f"--gin_file={gin}",
         f"--output_dir={out}"]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  import time
  deadline = time.time() + 120
  while time.time() < deadline:
    index = seqdata.read_index(str(out / "pairs"))
    if index and index["batches_done"] >= 3:
      break
    time.sleep(0.05)
  proc.kill()
  proc.wait()
  done = seqdata.read_index(str(out / "pairs"))["examples_done"]
  assert 3 <= done < N, done
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  rows = [json.loads(l) for l in (out / "pairs" / seqdata.SEQUENCES).read_text().splitlines()]
  assert [r["index"] for r in rows] == list(range(N))


def test_other_settings_refuse_to_continue_and_write_nothing(setup, tmp_path):
  root, task, models = setup
  out = tmp_path / "gen"
  with pytest.raises(RuntimeError):
    distill_data.generate(_config(task, models), str(out), crash_after_batches=1)
  before = (out / "pairs" / seqdata.SEQUENCES).read_bytes()
  with pytest.raises(ValueError, match=r"different \['temperature'\]"):
    distill_data.generate(_config(task, models, temperature=0.0), str(out))
  assert (out / "pairs" / seqdata.SEQUENCES).read_bytes() == before
  with pytest.raises(ValueError, match="unfinished: 8 of 37"):
    data_lib.tokenize_task(data_lib.TaskSpec(str(out / "pairs")), None, True)
  # A training-only setting is not part of the key: data generated before it existed resumes.
  spec = dataclasses.replace(_config(task, models).tasks[0], loss_on="continuation")
  assert distill_data.generation_key(_config(task, models, tasks=[spec])) == \
      distill_data.generation_key(_config(task, models))
  assert "loss_on" not in distill_data.generation_key(_config(task, models))["tasks"][0]


def test_mix_draws_batches_from_both_generators(setup, tmp_path):
  root, task, models = setup
  cfg = _config(task, models, temperature=0.0, mix_model=models["t5_test_draft"],
                mix_fraction=0.5, seed=3)
  distill_data.generate(cfg, str(tmp_path))
  by_batch = {}
  for r in _rows(tmp_path):
    by_batch.setdefault(r["index"] // 8, set()).add(r["generator"])
  assert all(len(g) == 1 for g in by_batch.values())  # one generator per batch
  expected = [models["t5_test_draft"] if distill_data.uses_mix(cfg, 0, k) else
              models["t5_test_target"] for k in range(5)]
  assert [next(iter(by_batch[k])) for k in range(5)] == expected
  assert len(set(expected)) == 2


def test_a_shared_encoder_draft_mixes_in_on_its_targets_encoding(setup, tmp_path):
  """On-policy data for a shared-encoder draft: its batches decode on the target's encoder output
  (greedy: the argmax of its full forward pass on that encoding); only beside its own target."""
  import jax.numpy as jnp
  from specdec_jax.checkpoints import pairing
  from specdec_jax.models.model import Model
  root, task, models = setup
  tcfg, tparams = load_checkpoint(models["t5_test_target"], dtype=np.float32)
  scfg = get_preset("t5_test_shared_draft", vocab_size=8192)
  shared = str(tmp_path / "shared")
  orbax_io.save(shared, scfg, load_checkpoint("t5_test_shared_draft", config=scfg, seed=3)[1])
  with pytest.raises(ValueError, match="has no paired_target.json"):
    distill_data.generate(_config(task, models, mix_model=shared, mix_fraction=1.0),
                        str(tmp_path / "unpaired"))
  with pytest.raises(ValueError, match="cannot generate alone; name it as mix_model"):
    distill_data.generate(_config(task, models, model=shared), str(tmp_path / "alone"))
  pairing.write(shared, target_name=models["t5_test_target"], target_config=tcfg,
                target_params=tparams)
  distill_data.generate(_config(task, models, temperature=0.0, mix_model=shared, mix_fraction=1.0),
                      str(tmp_path / "out"))
  rows = _rows(tmp_path / "out")
  assert [r["index"] for r in rows] == list(range(N)) and {r["generator"] for r in rows} == {shared}
  target, draft = Model(tcfg), Model(scfg)
  _, sparams = load_checkpoint(shared, dtype=np.float32)
  for r in rows[:4]:
    enc = jnp.asarray([r["input_ids"]], jnp.int32)
    out = r["output_ids"]
    dec = jnp.asarray([[0] + out[:-1]], jnp.int32)
    logits = draft.forward(sparams, enc, dec, encoded=target.encode(tparams, enc))
    assert np.asarray(logits)[0].argmax(-1).tolist() == out
  ocfg = get_preset("t5_test_target", vocab_size=8192)
  orbax_io.save(str(tmp_path / "other_target"), ocfg,
                load_checkpoint("t5_test_target", config=ocfg, seed=9)[1])
  with pytest.raises(ValueError, match="another encoder"):
    distill_data.generate(_config(task, models, model=str(tmp_path / "other_target"),
                                mix_model=shared, mix_fraction=1.0), str(tmp_path / "wrong"))
  assert not (tmp_path / "unpaired").exists() and not (tmp_path / "alone").exists()


def test_bad_configs_name_the_problem(setup):
  root, task, models = setup
  with pytest.raises(ValueError, match="no mix_model"):
    _config(task, models, mix_fraction=0.5)
  with pytest.raises(ValueError, match="temperature must be >= 0"):
    _config(task, models, temperature=-1.0)


def test_bad_input_writes_nothing(setup, tmp_path):
  root, task, models = setup
  with pytest.raises(ValueError, match="different kinds"):
    distill_data.generate(_config(task, models, mix_model="decoder_test_target", mix_fraction=0.5),
                        str(tmp_path / "a"))
  with pytest.raises(ValueError, match="vocab_size 64"):
    distill_data.generate(_config(task, models, model="t5_test_target"), str(tmp_path / "b"))
  with pytest.raises(Exception):
    distill_data.generate(_config(str(tmp_path / "missing.jsonl"), models), str(tmp_path / "c"))
  assert not list(tmp_path.iterdir())


def test_the_trainer_distils_on_generated_sequences(setup, tmp_path):
  """A finished directory is a task: inputs are the prompts, targets the generated tokens (no EOS
  added to a cut one), validation reads the source task's references."""
  root, task, models = setup
  gen = root / "straight" / "pairs"
  if not seqdata.is_generated(str(gen)):
    distill_data.generate(_config(task, models), str(root / "straight"))
  spec = data_lib.TaskSpec(name=str(gen), input_len=24, target_len=12)
  t = data_lib.tokenize_task(spec, None, True)
  rows = _rows(root / "straight")
  np.testing.assert_array_equal(t.targets_NxL[3, :len(rows[3]["output_ids"])], rows[3]["output_ids"])
  cut = [i for i, r in enumerate(rows) if len(r["output_ids"]) == 12 and r["output_ids"][-1] != 1]
  if cut:
    assert t.targets_NxL[cut[0], -1] != 1
  cfg = TrainConfig(model=models["t5_test_draft"], tasks=[spec], max_steps=2, batch_size=8,
                    checkpoint_every=1, log_every=1, eval_examples=8, export_dir=None,
                    teacher=models["t5_test_target"], divergence="tvd")
  summary = train(cfg, str(tmp_path / "train"), progress=False)
  assert summary["steps"] == 2 and 0 < summary["final_train_metrics"]["train/tvd"] <= 1
  assert set(summary["valid_cross_entropy"]) == {str(gen)}
  key = json.loads((tmp_path / "train" / "run_key.json").read_text())
  assert key["tasks_contents"] == [seqdata.content_digest(str(gen))]


@pytest.mark.slow
def test_sharded_generation_writes_what_one_device_does(setup, tmp_path):
  """On the 8 forced CPU devices (data 2 x model 2 x 2) the generator is sharded as in training:
  the same greedy sequences, and the mesh is not part of the key (a job may resume on another)."""
  from specdec_jax import sharding
  root, task, models = setup
  mesh = sharding.MeshConfig(data=2, model_outer=2, model_inner=2)
  cfg = _config(task, models, temperature=0.0)
  with pytest.raises(RuntimeError):
    distill_data.generate(dataclasses.replace(cfg, mesh=mesh), str(tmp_path / "a"),
                        crash_after_batches=2)
  distill_data.generate(cfg, str(tmp_path / "a"))  # resumed on one device
  distill_data.generate(cfg, str(tmp_path / "b"))
  assert _rows(tmp_path / "a") == _rows(tmp_path / "b")


def test_decoder_only_generation_resumes_and_trains(tmp_path):
  """The code pair's kind: prompts without EOS, continuations within target_len, every example
  once after a kill, and the directory trains a decoder-only draft on prompt + continuation."""
  n = 21
  lines = [{"prompt": f"def add_{i}(x):\n    # adds {i}", "canonical_solution": f"    return x + {i}\n"}
           for i in range(n)]
  task = tmp_path / "code.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  models = _save_presets(tmp_path, "decoder")
  spec = data_lib.TaskSpec(name=str(task), input_len=0, target_len=40)
  gen = distill_data.DistillDataConfig(model=models["decoder_test_target"], tasks=[spec],
                                       batch_size=8, temperature=1.0)
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  distill_data.generate(gen, str(straight))
  with pytest.raises(RuntimeError, match="simulated crash after batch 1"):
    distill_data.generate(gen, str(killed), crash_after_batches=1)
  distill_data.generate(gen, str(killed))
  out = killed / "code"
  assert (out / seqdata.SEQUENCES).read_bytes() == (
      straight / "code" / seqdata.SEQUENCES).read_bytes()
  rows = [json.loads(line) for line in (out / seqdata.SEQUENCES).read_text().splitlines()]
  assert [r["index"] for r in rows] == list(range(n))
  index = seqdata.read_index(str(out))
  assert index["kind"] == "decoder" and index["complete"]
  width = max(len(r["input_ids"]) for r in rows)
  assert all(1 not in r["input_ids"] and 0 not in r["input_ids"] for r in rows)
  assert all(1 <= len(r["output_ids"]) <= 40 - width for r in rows)
  gspec = data_lib.TaskSpec(name=str(out), input_len=0, target_len=40)
  t = data_lib.tokenize_task(gspec, None, False)
  seq = rows[5]["input_ids"] + rows[5]["output_ids"]
  np.testing.assert_array_equal(t.targets_NxL[5, :len(seq)], seq)
  # loss_on='continuation': only the generated reply is weighted (target j is token j + 1).
  reply = data_lib.tokenize_task(dataclasses.replace(gspec, loss_on="continuation"), None, False)
  both = [data_lib.batch_of(x, np.arange(n))["loss_weights"] for x in (t, reply)]
  for i, r in enumerate(rows):
    ids, p = np.array(r["input_ids"] + r["output_ids"]), len(r["input_ids"])
    np.testing.assert_array_equal(np.flatnonzero(both[0][i]), np.flatnonzero(ids[1:]))
    np.testing.assert_array_equal(np.flatnonzero(both[1][i]),
                                  [j for j in np.flatnonzero(ids[1:]) if j + 1 >= p])
    assert both[1][i, p - 1] == 1 and both[1][i, :p - 1].sum() == 0  # the reply's first token on
  with pytest.raises(ValueError, match="generated by a decoder model"):
    data_lib.tokenize_task(gspec, None, True)
  cfg = TrainConfig(model=models["decoder_test_draft"], tasks=[gspec], max_steps=2, batch_size=8,
                    checkpoint_every=1, log_every=1, eval_examples=8, export_dir=None,
                    teacher=models["decoder_test_target"], divergence="fkl")
  summary = train(cfg, str(tmp_path / "train"), progress=False)
  assert summary["steps"] == 2 and summary["final_train_metrics"]["train/loss"] > 0
