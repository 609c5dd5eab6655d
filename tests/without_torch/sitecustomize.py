"""Loaded first (Python loads a `sitecustomize` found on its path) by the processes the tests
start to run the package, so that they run it as a user's Mac has it: without torch.

transformers imports torch wherever it is installed (mlx-lm's tokenizer loading imports
transformers): 4 to 5 s of every process's start on this CPU. The tests install torch as their
oracle, so each of the hundred or so processes of the package they start would pay it, which no
user does. None in sys.modules is Python's mark of a module that is absent: transformers' check
(importlib.util.find_spec) finds no torch, and `import torch` fails as it does without it."""

import sys

sys.modules.setdefault("torch", None)
