"""A Linux sandbox for untrusted programs (model-written code): see ``runner.py`` for what it
contains and what it does not, ``_launcher.py`` for how the jail is built, ``_seccomp.py`` and
``_landlock.py`` for the kernel-side filters it adds."""

from .runner import (
    SCRATCH_DIR,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    run_sandboxed,
    sandbox_support,
)

__all__ = [
    "SCRATCH_DIR",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "run_sandboxed",
    "sandbox_support",
]
