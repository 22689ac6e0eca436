"""A task domain, as the training layer sees it.

Training reaches its tasks only through this package: the instance stream
(`pipeline.TaskSet`: rows of (task key, instance dict)), the prompt encoder
(`pipeline.PromptEncoder`: instance -> prompt ids, completion ids -> text), group
scoring (`pipeline.score_groups`: texts -> rewards and verdict statistics) and SFT
targets (`pipeline.sft_solutions`). Each looks its task up here by key;
`RewardConfig` (config.rl.reward) says how a verdict becomes a reward.

A new domain is one `Task` subclass, registered with `register(MyTask())`, after
which `config.tasks="my-key"` trains it with the same trainer, sweep and evaluation
as the NP-Bench tasks (tests/data/test_domain.py trains one end to end). It implements
the hooks of `Task` (dmpo_jax/tasks/base.py):

  key, title, category, direction ("min" | "max"), fields ({name: allowed types})
  _generate(rng, level) -> (instance dict, a feasible solution)   deterministic in rng
  _load(instance) -> problem          the parsed instance (any object with attributes)
  _parse(answer text) -> parsed       raise parsing.ParseError (default: a list of ints)
  _check(problem, parsed) -> (value, canonical solution)   raise Infeasible(reason)
  _reference(problem, rng, deadline) -> solution   the ground truth of the quality ratio
  _sample(problem, rng) -> solution   SFT targets ("sampled"; default: _reference)
  _compact(problem) -> str            the prompt of from-scratch models ("compact" style)
  format_answer(solution) -> str      the text after "Answer:"
and optionally _exact (proven optima: pass@k with correct = optimal), enumerate_optima
and solution_of (the collapse metrics and SFT on optimal targets), _npbench_instance
(the "npbench" prompt style) and _render (image prompts).
"""

from dmpo_jax.tasks import (COMPAT, IMAGE_STYLES, LEVELS, PROMPT_STYLES, Exact, Task, Verdict, get,
                            names, register, unregister, with_optima)
from dmpo_jax.tasks.base import Infeasible
from dmpo_jax.tasks.parsing import ParseError
from dmpo_jax.tasks.rewards import RewardConfig

__all__ = ["COMPAT", "IMAGE_STYLES", "LEVELS", "PROMPT_STYLES", "Exact", "Infeasible", "ParseError",
           "RewardConfig", "Task", "Verdict", "get", "names", "register", "unregister", "with_optima"]
