"""CPU kernels that XLA:CPU lacks, compiled at first use and called inside the jitted loops.

Two calls. `cache_write.write_block`: a decode step's keys and values written into the cache's own
buffer by a call the compiler cannot fuse into (XLA's own write was copied whole 2-4 times a
step; see there). `matmul.packed_matmul`: y = x @ W for the few rows a
decode step or a verification block has, with W packed once into panels [ceil(F / 16), D, 16].
Why: XLA:CPU's dot
takes a GEMM path from two rows on that reads the weights at half speed or worse, so on the zoo
target verifying 9 tokens cost 3.35x one token (DESIGN.md, "Machine facts";
shared/reference/CPU_VERIFY.md). The kernel reads each weight once for any row count, so the
verify cost follows the memory roofline. `build` compiles the C++ source shipped here against
`jax.ffi.include_dir()` into a per-user cache and registers it as an XLA FFI target; without a
compiler the packed layers use XLA's dot, with one log line. `specdec_jax.models.packed` packs a
model's params and chooses the kernel by config ('auto', 'xla', 'kernel'). Panels are float32,
bfloat16 (lossless for bfloat16-valued weights) or int8 with per-column scales (lossy: drafts
only, `RunConfig.draft_panels`).
"""
