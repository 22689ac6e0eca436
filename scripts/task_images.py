"""Write one example image per task (docs/images/<key>.png, `easy` instance, seed 0)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dmpo_jax import tasks  # noqa: E402

out = os.path.join(os.path.dirname(__file__), "..", "docs", "images")
os.makedirs(out, exist_ok=True)
for key in tasks.names():
  t = tasks.get(key)
  t.render(t.generate(0, "tiny" if key in ("minimum-cut",) else "easy"), 384).save(os.path.join(out, f"{key}.png"))
print("wrote", out)
