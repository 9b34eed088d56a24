"""scripts/compare_hf.py on tiny random presets: both sides run, greedy outputs agree with HF."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_compare_hf_tiny():
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  spec = importlib.util.spec_from_file_location("compare_hf",
                                                os.path.join(ROOT, "scripts", "compare_hf.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  res = mod.compare("t5_test_target", "t5_test_draft", num_examples=2, max_new_tokens=6,
                    gamma=2, temperatures=(0.0, 1.0), log=lambda *_: None)
  greedy = res["by_temperature"]["0"]
  assert greedy["greedy_agreement"] == {"ours_ar=hf_plain": 1.0, "ours_spec=ours_ar": 1.0,
                                        "hf_assisted=hf_plain": 1.0}
  for row in res["by_temperature"].values():
    assert all(v > 0 for v in row["tokens_per_s"].values())
  assert "spec/HF" in mod.table(res)


def test_compare_hf_fetched_gguf_target(tmp_path, monkeypatch):
  """The decoder-only path: a fetched GGUF target (a tiny one placed in the fetch cache) against
  transformers' load of the same file; greedy outputs of every system agree: with prompt
  lookup, then with a model draft (the converted target itself), whose export HF's assisted
  generation takes as its assistant model."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  pytest.importorskip("gguf")
  from specdec_jax.checkpoints import fetch
  from tests.checkpoints import gguf_testutil as gt
  downloads = tmp_path / "home" / "downloads"
  downloads.mkdir(parents=True)
  gt.write(str(downloads / "Tiny.gguf"))
  monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
  monkeypatch.setitem(fetch.REMOTE, "tiny-test", fetch.Remote(
      requirement="none==0", member="x/Tiny.gguf", sha256=fetch.sha256(str(downloads / "Tiny.gguf")),
      size=0, upstream="test", license="Apache-2.0"))
  spec = importlib.util.spec_from_file_location("compare_hf",
                                                os.path.join(ROOT, "scripts", "compare_hf.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  res = mod.compare_decoder("tiny-test", None, task="summarize", split="valid", num_examples=2,
                            max_new_tokens=6, max_input_length=64, gamma=2, temperatures=(0.0,),
                            repeats=1, torch_threads=0, seed=0, prompt_format="chat",
                            log=lambda *_: None)
  greedy = res["by_temperature"]["0"]
  assert greedy["greedy_agreement"] == {"ours_ar=hf_plain": 1.0, "ours_spec=ours_ar": 1.0,
                                        "hf_prompt_lookup=hf_plain": 1.0}
  assert "HF lookup" in mod.table(res, "hf_prompt_lookup", "HF lookup")
  res = mod.compare_decoder("tiny-test", fetch.ensure("tiny-test"), task="summarize",
                            split="valid", num_examples=2, max_new_tokens=6, max_input_length=64,
                            gamma=2, temperatures=(0.0,), repeats=1, torch_threads=0, seed=0,
                            prompt_format="chat", log=lambda *_: None)
  greedy = res["by_temperature"]["0"]
  assert greedy["greedy_agreement"] == {"ours_ar=hf_plain": 1.0, "ours_spec=ours_ar": 1.0,
                                        "hf_prompt_lookup=hf_plain": 1.0,
                                        "hf_assisted=hf_plain": 1.0}
  assert greedy["hf_assisted_vs_hf_plain"] > 0 and "HF assist" in mod.table(res)


def test_compare_hf_refuses_an_output_in_no_directory_before_decoding(tmp_path):
  """The error used to come after minutes of decoding, from the final write, losing them."""
  spec = importlib.util.spec_from_file_location("compare_hf",
                                                os.path.join(ROOT, "scripts", "compare_hf.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  missing = tmp_path / "no_such_dir" / "metrics.json"
  with pytest.raises(SystemExit, match="no directory"):
    mod.main(["--target=t5_test_target", f"--output={missing}"])
  assert not missing.parent.exists()
