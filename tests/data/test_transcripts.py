"""Transcripts (the perception stage's targets) name their instance exactly, and the reader
refuses text that names none."""

import pytest

from dmpo_jax import tasks
from dmpo_jax.data import transcripts


@pytest.mark.parametrize("key", tasks.names())
def test_every_transcript_reads_back_into_its_instance(key):
  task = tasks.get(key)
  for level in ("tiny", "easy"):
    for seed in range(20):
      q = task.generate(seed, level)
      s = transcripts.text(key, q)
      assert "Answer" not in s and s == s.strip()
      assert transcripts.same_instance(key, transcripts.read(key, s), q), (level, seed, s)


@pytest.mark.parametrize("key", tasks.names())
def test_a_changed_number_is_another_instance_or_refused(key):
  """The comparison can fail: bump the transcript's last number."""
  q = tasks.get(key).generate(3, "tiny")
  s = transcripts.text(key, q)
  head, last = s.rstrip("0123456789"), s[len(s.rstrip("0123456789")):]
  changed = head + str(int(last) + 1)
  try:
    other = transcripts.read(key, changed)
  except transcripts.TranscriptError:
    return  # e.g. a vertex id out of range
  assert not transcripts.same_instance(key, other, q)


@pytest.mark.parametrize("key, text, match", [
    ("TSP", "TSP n 3 dist 1 2", "upper triangle"),
    ("TSP", "GCP n 3 edges 0-1", "starts with 'TSP'"),
    ("GCP-D", "GCP n 3 edges 0-3", "between two of the vertices 0..2"),
    ("GCP-D", "GCP n 3 edges 0-x", "not an integer"),
    ("knapsack", "knap cap 10 items 3/4 5", "weight/value"),
    ("subset-sum", "subset target __import__('os') items 1", "not an integer"),
    ("meeting-schedule", "meet att 0 1 dur avail 1-2 rooms 1", "dur <minutes>"),
    ("set-cover", "cover n 2 sets 0 ; 5", "0..1"),
])
def test_bad_transcripts_name_what_is_wrong(key, text, match):
  with pytest.raises(transcripts.TranscriptError, match=match):
    transcripts.read(key, text)
