"""Adapters that turn real task libraries into rollforge environments (optional extras).

Each module imports its library only when an environment is built or sampled; a missing library
raises ``MissingDependency`` naming the extra to install. Registered in ``envs/library``:

- ``reasoning_gym:<dataset>`` (extra ``reasoning-gym``): any reasoning-gym dataset, one turn,
  scored by the dataset's own ``score_answer`` (``reasoning_gym_env.py``);
- ``textarena:<game id>`` (extra ``textarena``): single-player textarena games, multi-turn
  (``textarena_env.py``);
- ``frozenlake`` and ``gymnasium:<env id>`` (extra ``gymnasium``): gymnasium environments with
  text renderings, as tool environments (``gymnasium_env.py``);
- ``math`` (extra ``math``): answers verified symbolically by math-verify in a worker process
  under rollforge's own timeout (``math_env.py``, problems from ``math_problems.py``).

The extra ``tasks`` installs all four.
"""
