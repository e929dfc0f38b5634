"""Adapters that turn real task libraries into rollforge environments (optional extras).

Each module imports its library only when an environment is built or sampled; a missing library
raises ``MissingDependency`` naming the extra to install. Registered in ``envs/library``:

- ``reasoning_gym:<dataset>`` (extra ``reasoning-gym``): any reasoning-gym dataset, one turn,
  scored by the dataset's own ``score_answer`` (``reasoning_gym_env.py``);
- ``textarena:<game id>`` (extra ``textarena``): single-player textarena games, multi-turn
  (``textarena_env.py``);
- ``frozenlake`` and ``gymnasium:<env id>`` (extra ``gymnasium``): gymnasium environments with
  text renderings, as tool environments (``gymnasium_env.py``);
- ``skyrl:<id>`` and ``skyrl:<module>:<Class>`` (extra ``skyrl``): SkyRL-Gym ``BaseTextEnv``
  environments run unchanged, multi-turn with per-turn rewards (``skyrl_env.py``);
- ``math`` (extra ``math``): answers verified symbolically by math-verify in a worker process
  under rollforge's own timeout (``math_env.py``, problems from ``math_problems.py``);
- ``nemogym:<server URL>`` (extra ``nemo-gym``: httpx only): a running NeMo Gym resources server
  over HTTP, rollforge playing the agent; prompts are the server's dataset rows (``nemo_gym.py``,
  wire shapes in ``nemo_gym_wire.py``);
- ``verifiers:<taskset id or path>`` (no extra: its own venv, made by ``scripts/install.sh``): a
  verifiers 0.4 taskset run unchanged by a worker in that venv behind ``AgentEnvironment``, its
  reward verifiers' own (``verifiers_env.py``, the worker ``_verifiers_worker.py``).

The extra ``tasks`` installs the first four.

An item a family does not have (``gymnasium:CartPole-v9``) is a ``ConfigError`` from
``unknown_item``, naming it with the close names the library knows.
"""

from __future__ import annotations

import difflib
from typing import Iterable

from ...errors import ConfigError


def unknown_item(what: str, name: str, known: Iterable[str]) -> ConfigError:
    """The error for ``name``, not among the ``known`` names of ``what`` (a dataset, game, ...):
    the close ones when there are some, else all of them when they are few, else their stems."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name, known, n=6, cutoff=0.75)
    close += [k for k in known if k.lower().startswith(name.split("-")[0].lower()) and k not in close][: 6 - len(close)]
    if close:
        return ConfigError(f"unknown {what} {name!r}; close names: {', '.join(close)}")
    if len(known) <= 30:
        return ConfigError(f"unknown {what} {name!r}; known names: {', '.join(known)}")
    stems = sorted({k.split("-")[0] for k in known})  # "Wordle" for Wordle-v0, Wordle-v0-raw, ...
    shown = ", ".join(stems[:40]) + (", ..." if len(stems) > 40 else "")
    return ConfigError(f"unknown {what} {name!r}; known names start with: {shown} ({len(known)} names in all)")
