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
