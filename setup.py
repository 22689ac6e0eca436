"""dmpo_jax: RL on language models without mode collapse (DMPO, DPH-RL) in JAX/Flax NNX."""
from setuptools import find_packages, setup

setup(
    name="dmpo_jax",
    version="0.1.0",
    description="DMPO and DPH-RL on JAX/Flax NNX, with NP-Bench tasks.",
    packages=find_packages(include=["dmpo_jax", "dmpo_jax.*"]),
    python_requires=">=3.11",
    install_requires=[
        "jax",
        "flax>=0.12.4",
        "optax",
        "orbax-checkpoint",
        "ml_collections",
        "absl-py",
        "transformers",
        "safetensors",
        "tokenizers",
        "gguf",  # llama.cpp's reader: GGUF files (models/gguf.py), no torch needed
        "numpy",
        "tqdm",
        "matplotlib",
        "pillow",
        "ortools",  # CP-SAT: exact optima of the NP tasks
        "tensorboardX",
    ],
    extras_require={
        "test": [
            "pytest",
            "pytest-xdist",  # the suite runs in two processes (-n 2)
            "chex",
            "hypothesis",
            # Only the reference in parity tests; the CPU wheel of this pin is on disk.
            "torch==2.13.0",
            "accelerate",  # transformers' own GGUF load, the reference of tests/models/test_gguf.py
            "peft",  # the reference of the LoRA adapter round trip (tests/models/test_lora.py)
            "tensorflow-datasets",
            "array_record",
            "importlib_resources",
            "nbclient",  # executes the notebooks
            "nbformat",
            "ipykernel",
        ],
        # The TFDS builder (array_record files, no TensorFlow needed).
        "data": ["tensorflow-datasets", "array_record", "importlib_resources"],
        # reasoning-gym tasks as domains (dmpo_jax/data/gym.py, docs/GYM.md): the version whose
        # scorers data/gym_scorers.py re-implements and tests/data/test_gym.py checks against.
        "gym": ["reasoning-gym==0.1.25"],
    },
)
