"""Experiments on top of the training layer, generic: sweeps of labels x seeds of one config
(`sweep`; a study passes its `sweep.Design`), their report (`report`), seed-paired statistics
with Holm's correction (`stats`), matched comparisons along strength axes (`frontier`) and the
per-seed-target analysis (`confirm`). The studies that use them, with their designs and entry
points, live beside the library in studies/ (docs/COLLAPSE.md for the collapse experiment)."""
