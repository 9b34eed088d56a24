"""`materialize(tree)`: each array as it is, through a call the compiler cannot fuse into.

Why: a decode step updates each layer's cache (a dynamic-update-slice) and both attention and
the step's result read the update. XLA:CPU fused the update into each of the two consumers and,
since two fused copies of one update cannot both run in place, copied the layer's whole cache
for each (2 copies per layer per step inside the decode loop, 4 in a lone `extend`: at 1,026
slots of SmolLM2 ~94-190 MB moved per step, more bytes than attention reads). Behind this call
the update has one consumer, the call itself, whose output aliases its input: the update runs in
place and both consumers read the one buffer. `jax.lax.optimization_barrier` cannot do it
(XLA:CPU removes barriers before fusion).

The call is the kernel library's `specdec_materialize` (packed_matmul.cc): it does nothing when
its output aliases its input, which the program asks for. Only where the kernels run (a CPU run
on one device, the packed layouts); elsewhere, or without a compiler, the tree comes back
unchanged.
"""
from __future__ import annotations

import jax

from specdec_jax.kernels import build


def materialize(tree):
  """`tree` unchanged in value; each leaf passed through the in-place identity call."""
  if not build.load():
    return tree

  def one(x):
    call = jax.ffi.ffi_call(build.TARGET_NAME_MATERIALIZE, jax.ShapeDtypeStruct(x.shape, x.dtype),
                            input_output_aliases={0: 0})
    return call(x)
  return jax.tree.map(one, tree)
