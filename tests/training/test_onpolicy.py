"""On-policy distillation (DistillSpec's lambda): the student's own continuations, exact resume,
and the run key that guards the new settings."""
import json

import jax
import numpy as np
import pytest

from specdec_jax.checkpoints import load_checkpoint, orbax_io
from specdec_jax.data.vocabulary import default_vocabulary
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import onpolicy, run_key
from specdec_jax.training.trainer import TrainConfig, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("onpolicy")
  lines = [{"en": f"The dog number {i} ran to house {i % 5}.", "de": f"Der Hund {i} lief."}
           for i in range(40)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  models = {}
  for name, seed in (("t5_test_target", 1), ("t5_test_draft", 2)):
    # One layer each: compiles are most of the cost here.
    cfg = get_preset(name, vocab_size=8192, num_encoder_layers=1, num_decoder_layers=1)
    models[name] = str(root / name)
    orbax_io.save(models[name], cfg, load_checkpoint(name, config=cfg, seed=seed)[1])
  return root, str(task), models


def _config(task, models, **kw):
  spec = data_lib.TaskSpec(name=task, input_len=24, target_len=10)
  base = dict(model=models["t5_test_draft"], tasks=[spec], max_steps=6, batch_size=8,
              checkpoint_every=2, log_every=1, eval_examples=0, export_dir=None,
              learning_rate=0.05, teacher=models["t5_test_target"], divergence="jsd",
              on_policy_fraction=0.5, on_policy_temperature=1.0, seed=4)
  return TrainConfig(**{**base, **kw})


def _log(out):
  return [json.loads(l) for l in (out / "batches.jsonl").read_text().splitlines()]


def test_on_policy_steps_are_a_pure_function_of_seed_and_step():
  picks = [onpolicy.is_on_policy(0.5, 4, s) for s in range(400)]
  assert picks == [onpolicy.is_on_policy(0.5, 4, s) for s in range(400)]
  assert 150 < sum(picks) < 250
  assert not any(onpolicy.is_on_policy(0.0, 4, s) for s in range(50))
  assert all(onpolicy.is_on_policy(1.0, 4, s) for s in range(50))


def test_student_batch_is_the_students_continuation(setup):
  root, task, models = setup
  cfg, params = load_checkpoint(models["t5_test_draft"], dtype=np.float32)
  model = Model(cfg)
  vocab_task = data_lib.tokenize_task(data_lib.TaskSpec(task, input_len=24, target_len=10),
                                      default_vocabulary(), True)
  _, batch = data_lib.batch_at([vocab_task], 0, 8, 0)
  out = onpolicy.student_batch(model, params, batch, temperature=0.0, seed=0, step=3)
  ref = Decoder(model, sampling=SamplingConfig(), max_decode_len=10).generate(
      Params(params), batch["encoder_input_tokens"], jax.random.key(0))
  np.testing.assert_array_equal(out["decoder_target_tokens"], np.asarray(ref.tokens_BxN))
  np.testing.assert_array_equal(out["loss_weights"].sum(1), np.asarray(ref.lengths_B))
  np.testing.assert_array_equal(out["decoder_input_tokens"][:, 1:],
                                out["decoder_target_tokens"][:, :-1])
  assert (out["decoder_input_tokens"][:, 0] == 0).all()
  np.testing.assert_array_equal(out["encoder_input_tokens"], batch["encoder_input_tokens"])


@pytest.mark.slow  # ~80 s on the shared 2-core machine: three runs, checkpoints every 2 steps
def test_crash_and_resume_equals_uninterrupted(setup):
  """The killed run regenerates the lost step's on-policy batch from the restored parameters:
  the same digests, the same final parameters."""
  import orbax.checkpoint as ocp
  root, task, models = setup
  straight, crashed = root / "straight", root / "crashed"
  summary = train(_config(task, models), str(straight), progress=False)
  assert "train/jsd" in summary["final_train_metrics"]
  with pytest.raises(RuntimeError, match="simulated crash"):
    train(_config(task, models), str(crashed), crash_after_step=3, progress=False)
  train(_config(task, models), str(crashed), progress=False)
  log_a, log_b = _log(straight), _log(crashed)
  flags = [bool(r.get("on_policy")) for r in log_a]
  assert flags == [onpolicy.is_on_policy(0.5, 4, s) for s in range(6)] and 0 < sum(flags) < 6
  assert [r["step"] for r in log_b] == [0, 1, 2, 2, 3, 4, 5]
  assert {r["step"]: r["digest"] for r in log_a} == {r["step"]: r["digest"] for r in log_b}
  params = []
  for out in (straight, crashed):
    mgr = ocp.CheckpointManager(str(out / "checkpoints"))
    params.append(mgr.restore(6, args=ocp.args.StandardRestore())["params"])
  for a, b in zip(*map(jax.tree.leaves, params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_on_policy_batches_differ_from_the_data(setup, tmp_path):
  root, task, models = setup
  on = train(_config(task, models, on_policy_fraction=1.0, max_steps=1, checkpoint_every=1),
             str(tmp_path / "on"), progress=False)
  off = train(_config(task, models, on_policy_fraction=0.0, max_steps=1, checkpoint_every=1),
              str(tmp_path / "off"), progress=False)
  assert _log(tmp_path / "on")[0]["digest"] != _log(tmp_path / "off")[0]["digest"]
  assert on["final_train_metrics"]["train/jsd"] != off["final_train_metrics"]["train/jsd"]


def test_run_key_guards_the_new_settings(setup, tmp_path):
  root, task, models = setup
  out = tmp_path / "run"
  train(_config(task, models, max_steps=1, checkpoint_every=1), str(out), progress=False)
  key = json.loads((out / "run_key.json").read_text())
  assert (key["divergence"], key["jsd_beta"], key["on_policy_fraction"]) == ("jsd", 0.5, 0.5)
  with pytest.raises(ValueError, match=r"different \['divergence'\]"):
    train(_config(task, models, max_steps=4, divergence="tvd"), str(out), progress=False)
  with pytest.raises(ValueError, match=r"different \['on_policy_fraction'\]"):
    train(_config(task, models, max_steps=4, on_policy_fraction=0.25), str(out), progress=False)


def test_a_key_written_before_the_new_settings_resumes_with_their_defaults(setup, tmp_path):
  root, task, models = setup
  out = tmp_path / "old"
  cfg = _config(task, models, max_steps=1, checkpoint_every=1, divergence="fkl",
                on_policy_fraction=0.0)
  train(cfg, str(out), progress=False)
  key = json.loads((out / "run_key.json").read_text())
  for k in ("divergence", "jsd_beta", "on_policy_fraction", "on_policy_temperature",
            "tasks_contents"):
    del key[k]
  (out / "run_key.json").write_text(json.dumps(key))
  assert train(_config(task, models, max_steps=2, divergence="fkl", on_policy_fraction=0.0),
               str(out), progress=False)["steps"] == 2
  with pytest.raises(ValueError, match=r"different \['divergence'\]"):
    train(_config(task, models, max_steps=4, divergence="rkl", on_policy_fraction=0.0), str(out),
          progress=False)


def test_bad_configs_name_the_problem(setup):
  root, task, models = setup
  with pytest.raises(ValueError, match="no teacher is named"):
    _config(task, models, teacher=None)
  with pytest.raises(ValueError, match="unknown divergence 'l2'"):
    _config(task, models, divergence="l2")
  with pytest.raises(ValueError, match="on_policy_fraction must lie in"):
    _config(task, models, on_policy_fraction=1.5)
  with pytest.raises(ValueError, match="jsd_beta"):
    _config(task, models, jsd_beta=0.0)


def test_decoder_only_students_are_refused_before_training(tmp_path):
  code = tmp_path / "code.jsonl"
  code.write_text("\n".join(json.dumps({"prompt": f"def f{i}():", "canonical_solution": " pass"})
                            for i in range(10)) + "\n")
  cfg = TrainConfig(model="decoder_test_draft", teacher="decoder_test_target",
                    tasks=[data_lib.TaskSpec(str(code), input_len=0, target_len=16)], max_steps=1,
                    batch_size=4, eval_examples=0, on_policy_fraction=1.0)
  with pytest.raises(ValueError, match="decoder-only"):
    train(cfg, str(tmp_path / "out"), progress=False)
  assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.slow
def test_sharded_on_policy_generates_what_one_device_does(setup, tmp_path):
  """On the 8 forced CPU devices (data 2 x model 2 x 2) the student generates from its sharded
  parameters in the same loop: the first step's on-policy batch is the one-device batch, digest
  for digest, and its loss agrees up to float reassociation in the collectives."""
  from specdec_jax import sharding
  root, task, models = setup
  kw = dict(model=models["t5_test_target"], teacher=models["t5_test_target"], max_steps=1,
            checkpoint_every=1, on_policy_fraction=1.0, on_policy_temperature=0.0,
            divergence="tvd")
  mesh = sharding.MeshConfig(data=2, model_outer=2, model_inner=2)
  sharded = train(_config(task, models, mesh=mesh, **kw), str(tmp_path / "sharded"),
                  progress=False)
  single = train(_config(task, models, **kw), str(tmp_path / "single"), progress=False)
  assert _log(tmp_path / "sharded") == _log(tmp_path / "single")
  assert sharded["final_train_metrics"]["train/tvd"] == pytest.approx(
      single["final_train_metrics"]["train/tvd"], rel=1e-4, abs=1e-6)
