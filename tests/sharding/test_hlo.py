"""The compiled loop stays on device and runs in donated buffers (issue 3, check 3).

Why: the whole point of one jitted `lax.while_loop` is that the host sees only the final tokens;
a callback, an outfeed or a send/recv to the host inside the loop would cost a round trip per
iteration (~100x a loop step). We inspect the compiled, SPMD-partitioned HLO of the loop program
of the draft-on-fewer-chips layout. Donation: the loop program receives the prefilled state
(caches, token buffer) donated, so XLA aliases it to the loop's carry instead of copying the
caches into fresh buffers; the HLO's `input_output_alias` and the deleted inputs show it.
"""
import re

HOST_OPS = re.compile(r"\b(send|recv|send-done|recv-done|outfeed|infeed)\(")
CALLBACK = re.compile(r'custom_call_target="[^"]*(callback|python|host)[^"]*"', re.IGNORECASE)


def test_compiled_loop_stays_on_device(runs):
  hlo = runs.sharded("dp2_target4_draft2", 0.0).compiled.as_text()
  assert len(re.findall(r"\bwhile\(", hlo)) >= 1, "the decode loop must be a while op"
  assert not HOST_OPS.findall(hlo)
  assert not CALLBACK.findall(hlo)
  assert "host" not in " ".join(re.findall(r"memory_kind=\w+", hlo))
  # It is really partitioned: the models' collectives span devices.
  assert re.search(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all)(-start)?\(", hlo)


def test_cache_and_token_buffers_are_donated(runs):
  run = runs.sharded("dp2_target4_draft2", 0.0)
  hlo = run.compiled.as_text()
  assert "input_output_alias" in hlo
  aliased = len(re.findall(r"may-alias|must-alias", hlo.split("\n", 1)[0]))
  # Every self-attention K/V buffer of both models and the token buffer were consumed ...
  self_kv = {p for p in run.donated | run.kept if ".self_kv" in p}
  assert self_kv and self_kv <= run.donated, sorted(self_kv - run.donated)
  assert ".tokens_BxL" in run.donated
  # ... and aliased in the HLO (one alias per donated array at least, per device program).
  assert aliased >= len(run.donated)
  # What stays alive is loop-invariant (encoder cross-attention K/V), never a self-attention cache.
  assert all(".cross_kv" in p or ".encoder_mask" in p for p in run.kept), sorted(run.kept)
