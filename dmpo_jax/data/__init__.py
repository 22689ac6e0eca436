"""The host side of training data, between the tasks and the training layer.

domain.py     the task domain as training sees it: the Task hooks a new domain implements,
              register / get by key
pipeline.py   the instance stream (TaskSet: a pure function of seed, stage and step), the
              prompt encoder (instance -> prompt ids, completion ids -> text), group scoring
              (texts -> rewards and verdict statistics), SFT targets and padding
transcripts.py an instance as its compact transcript and back (the perception stage's targets)
splits.py     instance identity by content; the disjoint sets A (SFT + RL), B (RL only), C (eval)
instances.py  the config's TaskSet, and --dry_run's instances.json
images.py     image prompts for vision-language policies: the render cache, the image-prompt
              encoder, modalities (image, blank, text), prefetch of the next step's renders
gym.py        reasoning-gym tasks as registered domains (docs/GYM.md), scored by
gym_scorers.py  our re-implementations of their scorers, which never run model text

Imports run one way: models, tasks -> data -> training.
"""
