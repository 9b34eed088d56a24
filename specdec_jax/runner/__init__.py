"""The run pipeline behind `python -m specdec_jax.run`: config, prompts, models, timing, resumable
result files, metrics collection. No gin here; run.py binds gin to `runner.run_config.RunConfig`."""
