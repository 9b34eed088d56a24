"""Ahead-of-time compilation for TPU slices on a CPU-only host (`python -m specdec_jax.aot`).

Why: the paper configs target Cloud TPU v4 slices, and the TPU compiler (libtpu, the `tpu`
extra) compiles for a slice it is not attached to. Compiling the very programs the runner and the
trainer execute, with their shardings, tells before a slice is rented whether each fits in HBM and
whether the decode loop stays on device.

Modules, one idea each: `topologies` (slice names -> devices, chip figures), `abstract` (configs
without weights, sharded ShapeDtypeStructs), `programs` (the runner's and trainer's programs as
lowerable thunks), `memory` (compile; per-chip bytes, cost, fits), `hlo` (host transfers inside
loops), `steps` (the roofline's single steps as programs), `roofline` (c and v(T) from the
models' shapes, the compiled steps beside them), `job` (one config on one slice), `report`
(aot.json, the table), `cli` (gin + absl).
"""
