"""Setting a run up once: ``open_run`` builds the ``Run`` every step uses and closes what it opened
on exit (the process group, environments placed on Ray, the backend, the logbook).

What a run takes besides its config is declared once, in ``TrainOptions``: ``train``, ``atrain``
(``recipes/launch.py``) and ``open_run`` all take ``**options: Unpack[TrainOptions]`` (PEP 692), so
editors show the same typed keywords everywhere, and a keyword it does not declare is refused
(``check_options``) rather than ignored. Environments and prompts are read through
``inputs.read.read_inputs``; environment objects given to ``train()`` replace the default
environments (``given_environments``).

Setup reads its inputs before the model loads, so that a refusal (a prompt too long, a server that
does not answer, a run directory in the way) is quick; the prompts are checked there once, with the
renderer the run generates with, and the steps' rollouts do not check them again
(``Run.checked``). The policy comes out as one frozen
``TrainedPolicy`` (model, optimizer, schedule, KL reference, ranks), and the update's knobs as one
``UpdateSettings``, both built once here.
"""

from __future__ import annotations

import contextlib
import copy
import random
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, Sequence, TypedDict

import torch
from typing_extensions import Unpack

from ..backends.base import Backend
from ..chat.vision import renderer_for
from ..cluster.executor import placed
from ..cluster.generation import open_generation
from ..files import read_json
from ..inputs.data import PromptSource
from ..inputs.environments import named_environments
from ..inputs.read import held_out, read_inputs, read_samples, training_prompts
from ..models import load_text_side, resolve_device
from ..rollout.worker_pool import EngineWorkers
from . import checkpoint as ckpt
from .config import TrainConfig
from .distributed import Ranks, shard
from .generation_backend import backend_config, shared_model
from .logbook import Logbook
from .micro_batches import micro_batch_tokens_for
from .losses import PolicyLoss, get_aggregation
from .policy import compute_dtype, load_policy, make_optimizer, make_reference
from .policy_losses import policy_loss
from .preflight import Preflight, check_ranks, preflight, write_config
from ..inputs.rewards import RewardFunction, load_reward_functions
from .run import Run, push_weights
from .sync import PolicySync
from .update import TrainedPolicy, UpdateSettings


class TrainOptions(TypedDict, total=False):
    """What a run takes besides its config: the keywords of ``train``, ``atrain`` and ``open_run``,
    each optional.

    - ``environments``: environment objects in addition to the config's names (which then apply
      only when set explicitly, not the default ``arithmetic``): a dict task name -> an environment
      class, a zero-argument factory, a dict ``{name: factory}`` (TRL's multi-environment form) or
      an ``Environment``; or one such object, named after itself.
    - ``dataset``: prompt rows (dicts) instead of the config's ``data`` file.
    - ``reward_functions``: reward functions in addition to the config's ``rewards`` (default none).
    - ``resume``: continue from the newest checkpoint in ``out``. ``overwrite``: clear an ``out``
      that holds a run already. Without either, such an ``out`` is refused.
    - ``console``: print the progress line (default True).
    - ``on_step``: ``on_step(step, metrics, model, backend)`` (sync or async) runs after each step's
      weight sync, e.g. for custom evaluation (on rank 0, with the step's global metrics; with
      ``max_staleness`` >= 1 the backend is the versioned one, whose ``pinned()`` holds the weights
      during an evaluation).
    - ``backend``: a ``Backend`` to generate with instead of the one ``model.backend`` opens
      (whoever opened it closes it); it must generate with the trained model object or take
      ``update_weights``.
    """

    environments: Any
    dataset: Sequence[dict[str, Any]] | None
    reward_functions: Sequence[RewardFunction]
    resume: bool
    overwrite: bool
    console: bool
    on_step: Callable[..., Any] | None
    backend: Backend | None


def check_options(options: Mapping[str, Any], where: str) -> None:
    """Refuse a keyword that ``TrainOptions`` does not declare: a misspelt option is an error, not
    a default silently kept (as for any function's keywords: a ``TypeError``)."""
    known = list(TrainOptions.__annotations__)
    for name in options:
        if name not in known:
            raise TypeError(
                f"{where}() got an unexpected keyword argument {name!r}; expected one of {', '.join(known)}"
            )


@contextlib.asynccontextmanager
async def open_run(config: TrainConfig, **options: Unpack[TrainOptions]) -> AsyncIterator[Run]:
    """Set a run up (``TrainOptions`` says what each option does; ``on_step`` is the loop's) and
    close what it opened on exit: the process group, environments placed on Ray, the backend, the
    logbook."""
    check_options(options, "open_run")
    config, given = given_environments(config, options.get("environments"))
    backend = options.get("backend")
    local_envs, source, functions, checks, (tokenizer, processor, renderer) = _read_inputs(config, given, options)
    start = checks.resumed.step if checks.resumed is not None else 0
    async with contextlib.AsyncExitStack() as stack:
        ranks = stack.enter_context(Ranks.open(resolve_device(config.model.device)))
        check_ranks(config, ranks)
        Path(config.out).mkdir(parents=True, exist_ok=True)
        if ranks.main:
            write_config(Path(config.out), config)
        logbook = _open_logbook(stack, config, ranks, start, options.get("console", True))
        policy, generator = _load_policy(config, ranks, backend, checks.resumed, tokenizer)
        task_to_env = stack.enter_context(placed(local_envs, config.ray if config.executor == "ray" else None))
        served = backend is None and config.model.backend == "openai"  # by a server we did not start
        if backend is None:
            backend = await _open_backend(stack, config, generator, tokenizer, processor)
        loss_fn, aggregation = objective(config)
        run = Run(
            config=config,
            policy=policy,
            settings=update_settings(config, tokenizer, policy.model),
            generator=generator,
            tokenizer=tokenizer,
            renderer=renderer,
            loss_fn=loss_fn,
            aggregation=aggregation,
            source=source,
            functions=functions,
            task_to_env=task_to_env,
            backend=backend,
            sync=PolicySync(backend, generator),
            logbook=logbook,
            start=start,
            checked=checks.checked,
            eval_prompts=checks.held_out,
        )
        await _start(stack, run, served)
        run.evaluations = read_json(run.out / "eval.json")  # a resumed run's ``before``
        yield run


def given_environments(config: TrainConfig, environments: Any) -> tuple[TrainConfig, dict[str, Any]]:
    """The environment objects given to ``train()`` by task name, and the config the run reads them
    with: given objects replace the default environments (not those the config sets itself)."""
    given = named_environments(environments) if environments is not None else {}
    if given and "environments" not in config.model_fields_set:
        config = config.model_copy(update={"environments": []})  # the objects replace the default
    return config, given


def objective(config: TrainConfig) -> tuple[PolicyLoss, Any]:
    """The policy loss (with its off-policy correction: ``auto`` corrects where generation runs on
    older weights or another engine than the update) and how it aggregates over tokens."""
    algo = config.algorithm
    loss_fn = policy_loss(
        algo.policy_loss,
        correction=algo.off_policy_correction,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        kl_beta=algo.kl_beta,
        cap=algo.importance_cap,
        max_staleness=algo.max_staleness,
        backend=config.model.backend,
    )
    longest = algo.max_loss_tokens or config.rollout.max_new_tokens * config.rollout.max_turns
    return loss_fn, get_aggregation(algo.loss_aggregation, longest)


def update_settings(config: TrainConfig, tokenizer: Any, model: Any) -> UpdateSettings:
    """How every update of the run runs, from the config, the tokenizer's padding id and where the
    model lives (``optim.micro_batch_tokens: auto``)."""
    return UpdateSettings(
        micro_batch_tokens=micro_batch_tokens_for(config.optim.micro_batch_tokens, model),
        pad_id=tokenizer.pad_token_id,
        max_grad_norm=config.optim.max_grad_norm,
        compute_dtype=compute_dtype(config.model),
        skip_zero_advantage=config.algorithm.skip_zero_advantage,
    )


def _read_inputs(
    config: TrainConfig, given: dict[str, Any], options: TrainOptions
) -> tuple[dict[str, Any], PromptSource, list[RewardFunction], Preflight, tuple[Any, Any, Any]]:
    """What the run reads before the model loads: the environments by task, the prompt source (at
    the checkpoint's position when resuming), the reward functions, the preflight's findings (the
    checkpoint to resume, the training and held-out prompts checked), and the tokenizer with the processor of an
    image-text model (None for a text model) and the renderer, made once for the run: the checks
    here, the policy, the steps and the backend share them (the tokenizer of an image-text model is
    its processor's, its renderer a ``VisionRenderer``)."""
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    where = training_prompts(config.data, config.seed, options.get("dataset"))
    local_envs, prompts = read_inputs(config.environments, where, given)
    held = held_out(where, config.eval_episodes) if config.eval_episodes else None
    evaluated = read_samples(config.environments, held, list(local_envs), given) if held else []
    source = PromptSource(prompts, config.seed, config.data.shuffle)
    functions = [*load_reward_functions(config.rewards), *options.get("reward_functions", ())]
    tokenizer, processor = load_text_side(config.model.name)
    renderer = renderer_for(processor or tokenizer)
    resume, overwrite = options.get("resume", False), options.get("overwrite", False)
    checks = preflight(config, prompts, resume, overwrite, renderer, local_envs, evaluated)
    if checks.resumed is not None:
        source.load_state(checks.resumed.data_state)
    return local_envs, source, functions, checks, (tokenizer, processor, renderer)


def _load_policy(
    config: TrainConfig, ranks: Ranks, backend: Backend | None, resumed: ckpt.Loaded | None, tokenizer: Any
) -> tuple[TrainedPolicy, Any]:
    """The trained policy (sharded over the ranks, with its optimizer, schedule and KL reference,
    restored from ``resumed``) and the model object generation uses."""
    model, _ = load_policy(config.model, config.lora, tokenizer)
    # a sharded policy cannot generate, nor can one that trains while generation goes on
    # (max_staleness >= 1): the backend generates from a plain copy, refreshed at every sync
    apart = ranks.distributed or (
        config.algorithm.max_staleness > 0 and backend is None and config.model.backend == "hf"
    )
    generator = copy.deepcopy(model).requires_grad_(False) if apart else model
    model = shard(model, ranks)
    optimizer, scheduler = make_optimizer(model, config.optim, config.steps * config.algorithm.epochs_per_batch)
    reference = make_reference(model, config.model, config.algorithm.kl_beta, config.lora.enabled)
    if resumed is not None:
        ckpt.restore(resumed, model, optimizer, scheduler)
    return TrainedPolicy(model, optimizer, scheduler, reference, ranks), generator


def _open_logbook(
    stack: contextlib.AsyncExitStack, config: TrainConfig, ranks: Ranks, start: int, console: bool
) -> Logbook | None:
    """Rank 0's logbook, closed with the run; the other ranks log nothing. Opened before the model
    loads: a tracker of ``report_to`` that is not installed or cannot start its run fails quickly."""
    if not ranks.main:
        return None
    logbook = Logbook(
        Path(config.out),
        config.steps,
        start,
        console,
        report_to=config.report_to,
        config=config.model_dump(mode="json"),
    )
    stack.callback(logbook.close)
    return logbook


async def _open_backend(
    stack: contextlib.AsyncExitStack, config: TrainConfig, generator: Any, tokenizer: Any, processor: Any
) -> Backend:
    """The backend ``model.backend`` names, generating from ``generator`` when it runs in process."""
    generation = backend_config(
        config.model, config.rollout, config.ray, config.executor, config.seed, config.lora.enabled, config.vllm
    )
    return await stack.enter_async_context(
        open_generation(
            generation, hf_model=shared_model(generation, generator), tokenizer=tokenizer, processor=processor
        )
    )


async def _start(stack: contextlib.AsyncExitStack, run: Run, served: bool) -> None:
    """The backend on the trained weights where they differ from what it loaded, and the engine
    worker processes that every rollout and evaluation of a synchronous run uses."""
    config = run.config
    if run.start or config.lora.enabled or run.ranks.distributed or served:
        # a resumed, adapter-wrapped or sharded policy differs from what the engine loaded, and a
        # server may have loaded other weights than model.name (e.g. a warm-up's checkpoint)
        await push_weights(run)
    if config.rollout.engine_workers > 1 and not config.algorithm.max_staleness:  # every rollout and evaluation
        run.workers = await stack.enter_async_context(
            EngineWorkers(config.rollout.engine_workers, run.task_to_env, run.backend, run.renderer)
        )
