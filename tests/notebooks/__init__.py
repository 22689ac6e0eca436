"""The notebooks, executed (notebooks/build.py builds them)."""
