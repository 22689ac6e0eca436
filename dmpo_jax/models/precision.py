"""The compute dtype of `model.dtype = "auto"`: bfloat16 where the backend computes it natively,
float32 elsewhere.

bfloat16 compute (float32 master weights and optimizer state, float32 log-softmax, log-probs
and losses: docs/PERFORMANCE.md "Mixed precision") halves the activations' bytes, and pays
where the matrix units take bfloat16 inputs: TPUs, NVIDIA GPUs from Ampere (compute capability
8.0) on, and CPUs with AMX (`amx_bf16`) or AVX512-BF16 (`avx512_bf16`). Elsewhere a bfloat16
dot is float32 arithmetic plus conversions, slower and less exact, so "auto" keeps float32.
Where the hardware cannot be read (a CPU without /proc/cpuinfo, as on macOS; a GPU that
reports no CUDA compute capability, as ROCm's) it keeps float32 too: the safe choice.

"Native" is the hardware's capability, not a promise that XLA uses it for every dot at every
shape: benchmarks/dot_paths.py measures that for the update's shapes.

The machine is read by `local_backend`; `resolve` takes a `Backend`, so tests can simulate any.
"""

from __future__ import annotations

import dataclasses

AUTO = "auto"
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names, x86
MIN_CUDA_CAPABILITY = (8, 0)  # Ampere: bfloat16 tensor cores


@dataclasses.dataclass(frozen=True)
class Backend:
  """What decides the compute dtype: the platform of the run's devices ("cpu", "gpu", "tpu",
  ...), a CUDA GPU's compute capability ("8.0"; None when the device reports none), and the
  CPU's feature flags (None: unreadable)."""
  platform: str
  compute_capability: str | None = None
  cpu_flags: frozenset[str] | None = None


@dataclasses.dataclass(frozen=True)
class Precision:
  """The run's compute dtype: what the config asked for, what it resolved to, and why."""
  requested: str  # config.model.dtype: "float32", "bfloat16", "float16" or "auto"
  dtype: str      # the compute dtype the model is built with
  reason: str

  def record(self) -> dict:
    """The JSON record (results.json's "precision", the checkpoint's meta)."""
    return dataclasses.asdict(self)


def cpuinfo_field(name: str, path: str = "/proc/cpuinfo") -> str | None:
  """The first value of a /proc/cpuinfo field ("flags", "model name", "cpu family"); None when
  the file or the field is missing (macOS, Windows, an ARM kernel's "Features" line)."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
          return value.strip()
  except OSError:
    pass
  return None


def read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
  """The CPU's feature flags (the first "flags" line of /proc/cpuinfo), or None."""
  flags = cpuinfo_field("flags", path)
  return None if flags is None else frozenset(flags.split())


def local_backend(device=None) -> Backend:
  """This process's Backend: `device` (default the first of `jax.devices()`), its compute
  capability if it reports one, and /proc/cpuinfo's flags for a CPU."""
  import jax
  device = device if device is not None else jax.devices()[0]
  platform = device.platform
  capability = getattr(device, "compute_capability", None)
  return Backend(platform=platform, compute_capability=None if capability is None else str(capability),
                 cpu_flags=read_cpu_flags() if platform == "cpu" else None)


def _capability(text: str) -> tuple[int, int] | None:
  """"8.0" or "8.6" or "9" -> (major, minor); None when it is not a version."""
  parts = str(text).strip().split(".")
  try:
    nums = [int(p) for p in parts]
  except ValueError:
    return None
  return (nums[0], nums[1] if len(nums) > 1 else 0) if 1 <= len(nums) <= 2 else None


def native_bfloat16(backend: Backend) -> tuple[bool, str]:
  """(whether the backend computes bfloat16 natively, the reason in words)."""
  p = backend.platform.lower()
  if p == "tpu":
    return True, "TPU: bfloat16 matrix units"
  if p in ("gpu", "cuda", "rocm"):
    if backend.compute_capability is None:
      return False, f"{p} device reports no CUDA compute capability; float32 to be safe"
    cap = _capability(backend.compute_capability)
    if cap is None:
      return False, f"unreadable compute capability {backend.compute_capability!r}; float32 to be safe"
    need = ".".join(map(str, MIN_CUDA_CAPABILITY))
    if cap >= MIN_CUDA_CAPABILITY:
      return True, f"GPU compute capability {backend.compute_capability} >= {need}: bfloat16 tensor cores"
    return False, f"GPU compute capability {backend.compute_capability} < {need}: no bfloat16 tensor cores"
  if p == "cpu":
    if backend.cpu_flags is None:
      return False, "CPU flags unreadable (no /proc/cpuinfo flags line); float32 to be safe"
    have = [f for f in BF16_CPU_FLAGS if f in backend.cpu_flags]
    if have:
      return True, f"CPU flags {' '.join(have)}: native bfloat16 dot products"
    return False, f"CPU without {' or '.join(BF16_CPU_FLAGS)}: bfloat16 would be emulated"
  return False, f"platform {backend.platform!r} not known to compute bfloat16 natively; float32"


def resolve(requested: str, backend: Backend | None = None, field: str = "model.dtype") -> Precision:
  """config.model.dtype (or another setting, named by `field` in the reason: evaluate's
  --dtype) -> the Precision a run computes in. An explicit dtype is kept as it is; "auto" is
  bfloat16 where `native_bfloat16(backend)` (default: `local_backend()`), float32 otherwise."""
  if requested != AUTO:
    return Precision(requested, requested, f"set explicitly by {field}")
  native, why = native_bfloat16(backend if backend is not None else local_backend())
  return Precision(AUTO, "bfloat16" if native else "float32", why)

