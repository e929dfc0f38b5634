"""rollforge: multi-turn rollouts between language-model policies and environments.

The public API is re-exported here; everything else is internal. Names that need torch
(``HFBackend``, ``load_model``, ``load_tokenizer``) are imported on first use, so that
``import rollforge`` stays light.
"""

from __future__ import annotations

from typing import Any

from .backends.base import Backend, SamplingParams, WeightSync
from .backends.config import BackendConfig
from .backends.scripted import ScriptedBackend
from .backends.settings import HFSettings, OpenAICompatSettings, VLLMSettings
from .chat.families import Family, detect_family, get_family
from .chat.fidelity import token_fidelity_gap
from .chat.render import ChatRenderer, TemplateReport
from .chat.toolcalls import ToolCallParser, get_parser
from .envs.base import BaseSession, Environment, EnvSession, GeneratingEnvironment, Reset, Step
from .envs.check import CheckReport, acheck_env, check_env
from .envs.factory import FactoryEnvironment
from .envs.library import ENV_NAMES, EnvSpec, get_env_spec
from .envs.stepwise import StepwiseEnvironment, StepwiseReturn
from .errors import (
    ActorDied,
    BackendError,
    CheckpointError,
    ConfigError,
    ConnectionLost,
    ContextExceeded,
    EnvironmentError_,
    InvariantError,
    MissingDependency,
    ModelError,
    RewardUnavailable,
    RollforgeError,
    SandboxUnavailable,
    ServerError,
    TemplateError,
    ToolArgumentError,
)
from .placement import Placement, ServedBy
from .rollout.config import RolloutConfig
from .rollout.engine import RolloutResult, arollout, rollout
from .rollout.metrics import rollout_metrics
from .types import Completion, Failure, Message, Sample, Segment, ToolCall, Trajectory

_LAZY = {
    "AgentEnvironment": ("rollforge.gateway", "AgentEnvironment"),
    "EngineWorkers": ("rollforge.rollout.worker_pool", "EngineWorkers"),
    "HFBackend": ("rollforge.backends.hf", "HFBackend"),
    "load_model": ("rollforge.models", "load_model"),
    "load_tokenizer": ("rollforge.models", "load_tokenizer"),
    "OpenEnvEnvironment": ("rollforge.envs.openenv", "OpenEnvEnvironment"),
    "VLLMBackend": ("rollforge.backends.vllm", "VLLMBackend"),
    "OpenAICompatBackend": ("rollforge.backends.openai_compat", "OpenAICompatBackend"),
    "open_backend": ("rollforge.backends.opening", "open_backend"),
    "open_generation": ("rollforge.cluster.generation", "open_generation"),
}

__all__ = [
    "ActorDied",
    "AgentEnvironment",
    "Backend",
    "BackendConfig",
    "BackendError",
    "BaseSession",
    "ChatRenderer",
    "CheckReport",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "ConnectionLost",
    "ContextExceeded",
    "ENV_NAMES",
    "EngineWorkers",
    "EnvSession",
    "EnvSpec",
    "Environment",
    "EnvironmentError_",
    "FactoryEnvironment",
    "Failure",
    "Family",
    "GeneratingEnvironment",
    "HFBackend",
    "HFSettings",
    "InvariantError",
    "Message",
    "MissingDependency",
    "ModelError",
    "OpenAICompatBackend",
    "OpenAICompatSettings",
    "OpenEnvEnvironment",
    "Placement",
    "Reset",
    "RewardUnavailable",
    "RollforgeError",
    "RolloutConfig",
    "RolloutResult",
    "Sample",
    "SamplingParams",
    "SandboxUnavailable",
    "ScriptedBackend",
    "Segment",
    "ServedBy",
    "ServerError",
    "Step",
    "StepwiseEnvironment",
    "StepwiseReturn",
    "TemplateError",
    "TemplateReport",
    "ToolArgumentError",
    "ToolCall",
    "ToolCallParser",
    "Trajectory",
    "VLLMBackend",
    "VLLMSettings",
    "WeightSync",
    "acheck_env",
    "arollout",
    "check_env",
    "detect_family",
    "get_env_spec",
    "get_family",
    "get_parser",
    "load_model",
    "load_tokenizer",
    "open_backend",
    "open_generation",
    "rollout",
    "rollout_metrics",
    "token_fidelity_gap",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'rollforge' has no attribute {name!r}")
