"""Packed params: a compute layout only, with the same logits as the T5X-layout model.

Why: `pack` rewrites every projection a decode step multiplies; the packed model must compute what
the unpacked one does (full forward and cached decode at ragged offsets), give the T5X tree back
unchanged, and never reach sharding. 'auto' must choose the kernel on one CPU device and XLA's dot
on a mesh.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import packed
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import ragged_prompts, tiny_pair

T5_INPUTS = np.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0], [3, 1, 0, 0, 0], [11, 12, 13, 1, 0]])


def _same_tree(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("kind,matmul", [("t5", "hybrid"), ("decoder", "kernel")])
def test_pack_round_trip_and_which_weights_are_packed(kind, matmul):
  model, params, _, _ = tiny_pair(kind)
  pmodel, pparams = packed.pack(model, params, matmul)
  assert packed.is_packed(pmodel) and not packed.is_packed(model)
  flat = {"/".join(k.key for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(pparams)[0]}
  panels = sorted(k for k in flat if k.endswith("kernel_panels"))
  # Every decoder projection a step runs, and the head; not the encoder, not cross K/V. A
  # self-attention's query/key/value and an MLP's two input matrices are one fused matrix each.
  assert "decoder/logits_dense/kernel_panels" in panels
  assert "decoder/layers_0/self_attention/qkv/kernel_panels" in panels
  assert "decoder/layers_1/mlp/wi/kernel_panels" in panels
  assert "decoder/layers_1/mlp/wo/kernel_panels" in panels
  assert not any(part in k for k in flat for part in ("/query/", "/wi_0/", "/wi_1/")
                 if k.startswith("decoder/") and "encoder_decoder" not in k)
  assert not any(k.startswith("encoder/") for k in panels)
  if kind == "t5":
    assert "decoder/layers_0/encoder_decoder_attention/key/kernel" in flat
    assert "decoder/layers_0/encoder_decoder_attention/out/kernel_panels" in panels
  # "hybrid" keeps the T5X kernel beside the panels (the very same array); "kernel" drops it.
  head = pparams["decoder"]["logits_dense"]
  assert ("kernel" in head) == (matmul == "hybrid")
  if matmul == "hybrid":
    assert head["kernel"] is params["decoder"]["logits_dense"]["kernel"]
  assert pparams["token_embedder"]["embedding"] is params["token_embedder"]["embedding"]
  back_model, back = packed.unpack(pmodel, pparams)
  assert back_model == model
  _same_tree(back, params)


def _rounded_to_bfloat16(params):
  return jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16).astype(a.dtype), params)


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_bfloat16_valued_weights_pack_into_bfloat16_panels_with_the_same_logits(kind):
  """A checkpoint stored in bfloat16 (the zoo's, T5X's) packs into bfloat16 panels: half the
  bytes a decode step streams, and logits bit-for-bit those of float32 panels (`panels=
  'float32'`), decode blocks of 1 and 4 rows alike; weights that are not bfloat16 values (a
  random init) keep float32 panels."""
  model, params, _, _ = tiny_pair(kind)
  _, pparams = packed.pack(model, params)
  dtypes = {leaf.dtype for path, leaf in jax.tree_util.tree_flatten_with_path(pparams)[0]
            if path[-1].key == "kernel_panels"}
  assert dtypes == {jnp.dtype(jnp.float32)}
  params = _rounded_to_bfloat16(params)
  pmodel, p16 = packed.pack(model, params)
  _, p32 = packed.pack(model, params, panels="float32")
  panels = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(p16)[0]
            if path[-1].key == "kernel_panels"]
  assert panels and all(p.dtype == jnp.bfloat16 for p in panels)
  _same_tree(packed.unpack(pmodel, p16)[1], params)
  inputs = jnp.asarray(T5_INPUTS) if kind == "t5" else jnp.asarray([[5, 6, 7, 8, 9]] * 4)
  prefill = jax.jit(pmodel.prefill, static_argnums=2)
  extend = jax.jit(pmodel.extend)
  block = jnp.asarray(np.random.default_rng(0).integers(2, 64, (4, 5)), jnp.int32)
  got = {}
  for name, pp in (("bf16", p16), ("f32", p32)):
    _, cache = extend(pp, prefill(pp, inputs, 24), block[:, :1])
    got[name] = (np.asarray(extend(pp, cache, block[:, 1:])[0]),
                 np.asarray(extend(pp, cache, block[:, 1:2])[0]))
  for a, b in zip(got["bf16"], got["f32"]):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="panels must be one of"):
    packed.pack(model, params, panels="bfloat16")


def test_scanned_layers_pack_and_compute():
  model = Model(get_preset("decoder_test_target", scan_layers=True))
  params = model.init(jax.random.key(0))
  pmodel, pparams = packed.pack(model, params, "kernel")
  # stacked [layers, ...]; wi_0 and wi_1 (64 columns each) fused: 128 columns, 8 panels
  assert pparams["decoder"]["layers"]["mlp"]["wi"]["kernel_panels"].shape == (2, 8, 32, 16)
  tokens = jnp.asarray([[5, 6, 7, 8, 9]], jnp.int32)
  np.testing.assert_allclose(np.asarray(pmodel.forward(pparams, tokens, tokens)),
                             np.asarray(model.forward(params, tokens, tokens)),
                             rtol=1e-5, atol=1e-5)
  _same_tree(packed.unpack(pmodel, pparams)[1], params)


@pytest.mark.parametrize("block,matmul", [(1, "kernel"), (4, "kernel"), (4, "hybrid")])
def test_t5_cached_decode_with_kernel_matches_full_forward(block, matmul):
  """Decode with packed weights at per-example offsets == the unpacked model's full forward."""
  model, params, _, _ = tiny_pair("t5")
  pmodel, pparams = packed.pack(model, params, matmul)
  rng = np.random.default_rng(0)
  seq_BxT = jnp.asarray(np.concatenate([np.zeros((4, 1), int), rng.integers(2, 64, (4, 12))],
                                       axis=1), jnp.int32)
  full = np.asarray(jax.jit(model.forward)(params, jnp.asarray(T5_INPUTS), seq_BxT))
  starts = np.array([4, 2, 1, 3])
  extend = jax.jit(pmodel.extend)
  cache = jax.jit(pmodel.prefill, static_argnums=2)(pparams, jnp.asarray(T5_INPUTS), 24)
  _, cache = extend(pparams, cache, seq_BxT[:, :4])
  cache = cache.rollback(jnp.asarray(starts))
  rest = jnp.asarray(np.stack([np.asarray(seq_BxT)[b, s:s + 8] for b, s in enumerate(starts)]))
  outs = []
  for s in range(0, 8, block):
    logits, cache = extend(pparams, cache, rest[:, s:s + block])
    outs.append(np.asarray(logits))
  want = np.stack([full[b, s:s + 8] for b, s in enumerate(starts)])
  np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-5, atol=1e-5)


def test_decoder_prefill_and_extend_with_kernel_match_full_forward():
  model, params, _, _ = tiny_pair("decoder")
  pmodel, pparams = packed.pack(model, params, "kernel")
  lengths = [6, 3, 1, 5]
  seqs, prompts = ragged_prompts(lengths, extra=8)
  cache = jax.jit(pmodel.prefill, static_argnums=2)(pparams, jnp.asarray(prompts), 32)
  feed = np.stack([s[n - 1:n + 7] for s, n in zip(seqs, lengths)])
  got, _ = jax.jit(pmodel.extend)(pparams, cache, jnp.asarray(feed))
  padded = np.zeros((4, max(lengths) + 7), np.int32)  # causal: padding cannot leak backwards
  for b, (s, n) in enumerate(zip(seqs, lengths)):
    padded[b, :n + 7] = s[:n + 7]
  full = np.asarray(jax.jit(model.forward)(params, None, jnp.asarray(padded)))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(np.asarray(got)[b], full[b, n - 1:n + 7], rtol=1e-5, atol=1e-5)


def test_matmul_choice():
  model, params, _, _ = tiny_pair("decoder")
  assert packed.resolve_matmul("xla") == "xla"
  assert packed.resolve_matmul("auto") == "hybrid"  # the tests run on a CPU backend
  assert packed.resolve_matmul("kernel") == "kernel"
  assert packed.for_backend(model, params, "xla") == (model, params)
  pmodel, _ = packed.for_backend(model, params, "auto")
  assert packed.is_packed(pmodel) and pmodel.matmul == "hybrid"
  assert packed.for_backend(pmodel, params) == (pmodel, params)  # already packed
  drafter = object()  # a model-free draft: nothing to pack
  assert packed.for_backend(drafter, {}) == (drafter, {})
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("model",))
  assert packed.resolve_matmul("auto", mesh) == "xla"
  with pytest.raises(ValueError, match="on a mesh"):
    packed.resolve_matmul("kernel", mesh)
  with pytest.raises(ValueError, match="matmul must be one of"):
    packed.resolve_matmul("fast")


def test_packed_trees_stay_away_from_sharding_and_double_packing():
  model, params, _, _ = tiny_pair("decoder")
  pmodel, pparams = packed.pack(model, params)
  with pytest.raises(ValueError, match="no sharding"):
    pmodel.logical_axes()
  with pytest.raises(ValueError, match="already"):
    packed.pack(pmodel, pparams)
  with pytest.raises(ValueError, match="not this model's tree"):
    packed.pack(model, {"decoder": {}})


@pytest.mark.parametrize("rows,features,kernel_expected,bf16", [
    (1, 64, True, False),          # one row of a small matrix: the kernel
    (1, 40000, False, False),      # one row of a matrix over HYBRID_GEMV_MAX_BYTES: XLA's mat-vec
    (1, 40000, True, True),        # ... unless its panels are bfloat16 (half the bytes)
    (3, 40000, True, False),       # a verification block: the kernel, whatever the size
    (65, 64, False, False)])       # a GEMM past HYBRID_MAX_KERNEL_ROWS: XLA's dot
def test_hybrid_dense_chooses_by_rows_and_weight_bytes(rows, features, kernel_expected, bf16):
  from specdec_jax.kernels import build
  from specdec_jax.models.layers import HYBRID_GEMV_MAX_BYTES, Dense
  assert (64 * 40000 * 4 > HYBRID_GEMV_MAX_BYTES) and (64 * 64 * 4 < HYBRID_GEMV_MAX_BYTES)
  layer = Dense(features, ("embed", "mlp"), matmul="hybrid")
  x = jnp.ones((rows, 64), jnp.float32)
  params = layer.init(jax.random.key(0), x)
  # `init` draws the two layouts independently; `pack` gives them the same weights.
  from specdec_jax.kernels import matmul as kmatmul
  if bf16:
    params["params"]["kernel"] = _rounded_to_bfloat16(params["params"]["kernel"])
  params["params"]["kernel_panels"] = kmatmul.pack_panels(
      params["params"]["kernel"], jnp.bfloat16 if bf16 else jnp.float32)
  hlo = jax.jit(layer.apply).lower(params, x).compile().as_text()
  target = build.TARGET_NAME_BF16 if bf16 else build.TARGET_NAME
  assert (f'custom_call_target="{target}"' in hlo) == kernel_expected
  want = x @ params["params"]["kernel"]
  np.testing.assert_allclose(np.asarray(layer.apply(params, x)), np.asarray(want), rtol=1e-5,
                             atol=1e-4)


@pytest.mark.parametrize("kind,matmul", [("t5", "hybrid"), ("decoder", "kernel"),
                                         ("llama", "hybrid")])
def test_int8_draft_panels_are_one_draft_in_every_path(kind, matmul):
  """`panels='int8'` (a draft's layout): every packed projection holds int8 panels with their
  scales, "hybrid"'s XLA kernel is the dequantized matrix (one draft whichever path a call takes),
  the unpacked tree is the dequantized draft, and its logits (full forward and cached decode)
  are the dequantized draft's under XLA's dot, within float32 summation order. A tied head
  (llama's preset) is untied first and quantized with the rest: its `logits_dense` is the
  embedding's transpose, rounded."""
  _, _, draft, dp = tiny_pair(kind)
  tied = draft.config.tie_embeddings
  assert tied == (kind == "llama")
  pmodel, pparams = packed.pack(draft, dp, matmul, panels="int8")
  flat = {"/".join(k.key for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(pparams)[0]}
  panels = [k for k in flat if k.endswith("kernel_panels")]
  assert panels and all(flat[k].dtype == jnp.int8 for k in panels)
  if matmul == "hybrid":
    for k in panels:
      np.testing.assert_array_equal(
          np.asarray(flat[k[:-len("_panels")]]),
          np.asarray(kmatmul_unpack(flat[k], flat[k[:-len("_panels")]].shape[-1])))
  assert "decoder/logits_dense/kernel_panels" in panels
  base, back = packed.unpack(pmodel, pparams)
  assert base == (dataclasses.replace(draft, config=dataclasses.replace(
      draft.config, tie_embeddings=False)) if tied else draft)
  back_flat = {"/".join(k.key for k in path): leaf
               for path, leaf in jax.tree_util.tree_flatten_with_path(back)[0]}
  orig_flat = {"/".join(k.key for k in path): leaf
               for path, leaf in jax.tree_util.tree_flatten_with_path(dp)[0]}
  if tied:  # the input embedding is kept as it was; the head is its rounded transpose
    np.testing.assert_array_equal(np.asarray(back_flat["token_embedder/embedding"]),
                                  np.asarray(orig_flat["token_embedder/embedding"]))
    orig_flat["decoder/logits_dense/kernel"] = np.asarray(orig_flat["token_embedder/embedding"]).T
  names = [k[:-len("_panels")] for k in panels]
  for fused, parts in packed.FUSED.items():  # a fused matrix's columns are its parts'
    names = [n for name in names for n in (
        [name.replace(f"/{fused}/", f"/{part}/") for part in parts] if f"/{fused}/" in name
        else [name])]
  for name in names:  # rounded, by at most half a step of its column's scale
    diff = np.abs(np.asarray(back_flat[name]) - np.asarray(orig_flat[name]))
    assert diff.any() and (diff <= np.abs(np.asarray(orig_flat[name])).max(axis=-2) / 254
                           * (1 + 1e-5)).all()
  tokens = jnp.asarray([[3, 5, 7, 9, 2, 4], [6, 8, 1, 0, 0, 0]], jnp.int32)
  if kind == "t5":
    inputs = jnp.asarray(T5_INPUTS[:2], jnp.int32)
    want = base.forward(back, inputs, tokens)
    got = pmodel.forward(pparams, inputs, tokens)
  else:
    want = base.forward(back, None, tokens)
    got = pmodel.forward(pparams, None, tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_int8_untied_head_keeps_a_restricted_heads_ids():
  """A tied draft with a restricted head (`head_ids`) packed as int8: the untied head holds the
  embedding rows of those ids only, and the logits stay -inf off them (the same draft, rounded)."""
  _, _, draft, dp = tiny_pair("llama")
  ids = (1, 3, 4, 9, 17, 30, 41, 50)
  restricted = dataclasses.replace(draft, head_ids=ids)
  pmodel, pparams = packed.pack(restricted, dp, "hybrid", panels="int8")
  assert pparams["decoder"]["logits_dense"]["kernel"].shape == (draft.config.emb_dim, len(ids))
  tokens = jnp.asarray([[3, 5, 7, 9, 2, 4]], jnp.int32)
  got = np.asarray(pmodel.forward(pparams, None, tokens))
  want = np.asarray(restricted.forward(dp, None, tokens))
  off = np.setdiff1d(np.arange(draft.config.vocab_size), ids)
  assert np.isneginf(got[..., off]).all() and np.isneginf(want[..., off]).all()
  np.testing.assert_allclose(got[..., list(ids)], want[..., list(ids)], rtol=0.05, atol=0.05)


def kmatmul_unpack(panels_, features):
  from specdec_jax.kernels import matmul as kmatmul
  return kmatmul.unpack_panels(panels_, features)


def test_int8_panels_are_for_drafts_on_the_kernel_only():
  model, params, draft, dp = tiny_pair("decoder")
  with pytest.raises(ValueError, match="never a target's"):
    packed.for_backend(model, params, "auto", panels="int8")
  pdraft, pdp = packed.for_backend(draft, dp, "auto", panels="int8", role="draft")
  assert pdraft.matmul == "hybrid"
  assert pdp["decoder"]["logits_dense"]["kernel_panels"].dtype == jnp.int8
  with pytest.raises(ValueError, match="need the packed CPU kernel"):
    packed.for_backend(draft, dp, "xla", panels="int8", role="draft")
  with pytest.raises(ValueError, match="panels must be one of"):
    packed.for_backend(draft, dp, "auto", panels="fp8", role="draft")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_fused_products_columns_are_the_separate_products_bit_for_bit(dtype):
  """Why fusing is free of numerics: the kernel computes each output column alone, so x @ [A B C]
  through one panel array equals x @ A, x @ B, x @ C side by side to the last bit, for one row and
  for a verification block, whatever the part widths (40 is not a multiple of the panel width)."""
  from specdec_jax.kernels import matmul as kmatmul  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  parts = [jnp.asarray(rng.standard_normal((48, f), dtype=np.float32)).astype(dtype)
           .astype(jnp.float32) for f in (64, 40, 32)]
  fused = kmatmul.pack_panels(jnp.concatenate(parts, axis=-1), dtype)
  for rows in (1, 4):
    x = jnp.asarray(rng.standard_normal((rows, 48), dtype=np.float32))
    got = kmatmul.packed_matmul(x, fused, 136)
    want = jnp.concatenate([kmatmul.packed_matmul(x, kmatmul.pack_panels(w, dtype), w.shape[1])
                            for w in parts], axis=-1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _cache_copies(model, params, cache, tokens_BxT) -> int:
  """Copies of whole cache arrays in a compiled, donated `extend` (kernels/cache_write.py)."""
  shapes = {tuple(x.shape) for x in jax.tree.leaves(cache.self_kv)}
  text = jax.jit(model.extend, donate_argnums=1).lower(params, cache, tokens_BxT).compile(
  ).as_text()
  copies = 0
  for line in text.splitlines():
    if " copy(" in line and "= f32[" in line:
      dims = line.split("= f32[", 1)[1].split("]", 1)[0]
      copies += tuple(int(d) for d in dims.split(",") if d) in shapes
  return copies


def test_cache_update_is_not_copied_with_the_kernels():
  """The kernels' path writes each layer's cache in place (`kernels.cache_write`): XLA:CPU had
  fused its own update into attention's read and into the returned cache, copying the layer's
  whole cache for each (4 copies per array in a lone extend, counted here before the fix)."""
  lm, lp, _, _ = tiny_pair("llama")
  pm, pp = packed.pack(lm, lp, "kernel")
  cache = jax.jit(pm.prefill, static_argnums=2)(pp, jnp.full((1, 5), 7, jnp.int32), 300)
  assert _cache_copies(pm, pp, cache, jnp.full((1, 1), 3, jnp.int32)) == 0


def test_write_in_place_writes_what_write_writes_and_refuses_a_block_past_the_end():
  """`LayerKV.write_in_place` (the kernels' call) against the general scatter `write`, at ragged
  starts, one and several tokens, up to the last slot; a block past the end is an error."""
  from specdec_jax.models.kv_cache import LayerKV  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  kv = LayerKV(jnp.asarray(rng.standard_normal((3, 2, 4, 12)), jnp.float32),
               jnp.asarray(rng.standard_normal((3, 2, 12, 4)), jnp.float32))
  for t, starts in ((1, [0, 5, 11]), (4, [0, 3, 8]), (12, [0, 0, 0])):
    k = jnp.asarray(rng.standard_normal((3, t, 2, 4)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((3, t, 2, 4)), jnp.float32)
    start_B = jnp.asarray(starts, jnp.int32)
    want = kv.write(k, v, start_B[:, None] + jnp.arange(t)[None, :])
    _same_tree(want, jax.jit(kv.write_in_place)(k, v, start_B))
  k = v = jnp.ones((3, 2, 2, 4), jnp.float32)
  with pytest.raises(Exception, match="example 2 writes slots 11..12 of a cache of 12"):
    jax.block_until_ready(jax.jit(kv.write_in_place)(k, v, jnp.asarray([0, 3, 11], jnp.int32)))


@pytest.mark.parametrize("kind,matmul", [("t5", "hybrid"), ("llama", "kernel")])
def test_q4_self_draft_is_one_draft_in_every_path(kind, matmul):
  """`panels='q4'` on a target's own checkpoint (the self-draft it is for; every input width a
  multiple of 32): every packed projection of a layer holds q4 panels (uint8), the output head
  int8 ones (`packed._lossy_layout`; a tied head untied first), "hybrid"'s XLA kernel is the
  dequantized matrix, and the logits
  (full forward) are the dequantized model's under XLA's dot. A draft whose widths are not
  multiples of 32 is refused by name, not packed some other way."""
  model, params, draft, dp = tiny_pair(kind)
  pmodel, pparams = packed.pack(model, params, matmul, panels="q4")
  flat = {"/".join(k.key for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(pparams)[0]}
  panels = [k for k in flat if k.endswith("kernel_panels")]
  head = "decoder/logits_dense/kernel_panels"
  assert head in panels
  assert flat[head].dtype == jnp.int8
  assert len(panels) > 1 and all(flat[k].dtype == jnp.uint8 for k in panels if k != head)
  if matmul == "hybrid":
    for k in panels:
      np.testing.assert_array_equal(
          np.asarray(flat[k[:-len("_panels")]]),
          np.asarray(kmatmul_unpack(flat[k], flat[k[:-len("_panels")]].shape[-1])))
  base, back = packed.unpack(pmodel, pparams)
  tokens = jnp.asarray([[3, 5, 7, 9, 2, 4], [6, 8, 1, 0, 0, 0]], jnp.int32)
  inputs = jnp.asarray(T5_INPUTS[:2], jnp.int32) if kind == "t5" else None
  want = base.forward(back, inputs, tokens)
  got = pmodel.forward(pparams, inputs, tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
  assert not np.allclose(np.asarray(got), np.asarray(model.forward(params, inputs, tokens)))
  with pytest.raises(ValueError, match="not a multiple of 32"):
    packed.pack(draft, dp, matmul, panels="q4")
  with pytest.raises(ValueError, match="never a target's"):
    packed.for_backend(model, params, "auto", panels="q4")
