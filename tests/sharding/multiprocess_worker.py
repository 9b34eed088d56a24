"""One process of the two-process speculative decode (run by test_multiprocess.py, not pytest).

  python multiprocess_worker.py PORT PROCESS_ID NUM_PROCESSES TEMPERATURE

Each process forces 4 CPU devices, joins the job via `distributed.initialize`, builds the global
(data 2, outer 2, inner 2) mesh over all 8 devices (data crosses the processes), loads only its
own rows of the batch, decodes, gathers the result and prints it as one JSON line.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sharding_tiny import BATCH, GAMMA, MAX_LEN, sampling_for, tiny_inputs, tiny_models  # noqa: E402
from specdec_jax import distributed, sharding as sh  # noqa: E402
from specdec_jax.decoding.decoder import Decoder, Params  # noqa: E402
from specdec_jax.decoding.speculative import Chain  # noqa: E402


def main(port: int, process_id: int, num_processes: int, temperature: float) -> None:
  distributed.initialize(f"localhost:{port}", num_processes, process_id)
  assert jax.device_count() == 4 * num_processes and jax.local_device_count() == 4
  t, tp, d, dp = tiny_models()  # same seed, same params in every process
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(2, 2, 2), batch_size=BATCH)
  rows = distributed.local_rows(sh.batch_sharding(p.mesh, p.target.axis_rules), BATCH)
  local = tiny_inputs()[rows]  # a real loader would read only these examples
  decoder = Decoder(p.target, p.draft, Chain(GAMMA), sampling_for(temperature),
                    max_decode_len=MAX_LEN, mesh=p.mesh)
  out = decoder.generate(Params(p.target_params, p.draft_params), local, jax.random.key(1),
                         process_local=True)
  host = distributed.gather(out)
  print(json.dumps({"process": jax.process_index(), "rows": [rows.start, rows.stop],
                    "main": distributed.is_main_process(),
                    "tokens": np.asarray(host.tokens_BxN).tolist(),
                    "lengths": np.asarray(host.lengths_B).tolist()}), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
