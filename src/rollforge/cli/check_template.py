"""``rollforge check-template MODEL_OR_TEMPLATE_FILE``: will this model's chat template train?

Prints the detected family (``chat/families.py``), its tool-call parser, where tools go, whether
turns are appended (prefix-preserving) or episodes continue in segments (and why), for a
conversation without tools and one with tools; then rolls out a sample three-turn tool
conversation with a scripted policy replying in the family's format and prints each segment with
the policy's tokens -- the ones trained on -- between ``⟦`` and ``⟧``, and whether every segment is
token-exact.

The argument is a model (a directory, a built-in alias or a cached hub id: its tokenizer and
template) or a chat-template file (``.jinja``, or a ``tokenizer_config.json`` holding
``chat_template``). A template file is paired with ``--tokenizer`` when given, else with
rollforge's small built-in byte-level test tokenizer; either way every control token the template
writes (``<|...|>``, ``<｜...｜>``, ``<start_of_turn>``, ``[INST]``-style) that the tokenizer
lacks is added as a special token, as the model's own tokenizer has it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError

_CONTROL = re.compile(r"<\|[\w.\-]+\|>|<｜[^｜<>]+｜>|<(?:start|end)_of_turn>|<bos>|<eos>|\[/?[A-Z][A-Z_]{2,}\]")
_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up a number.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer", "description": "The number."}},
            "required": ["x"],
        },
    },
}


def add_parser(commands: Any) -> None:
    p = commands.add_parser("check-template", help="check a model's chat template before training on it")
    p.add_argument(
        "model", metavar="MODEL_OR_TEMPLATE_FILE", help="a model (directory, alias, hub id) or a chat-template file"
    )
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer to pair with a template file (default: a built-in test tokenizer)"
    )
    p.add_argument("--family", default=None, help="model family (default: detected from the template)")
    p.add_argument("--keep-reasoning", action="store_true", help="render with the family's keep-past-reasoning options")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    from ..chat.render import ChatRenderer

    tokenizer, source = load(args.model, args.tokenizer)
    renderer = ChatRenderer(tokenizer, args.family, keep_reasoning=args.keep_reasoning)
    family = renderer.family
    print(f"template:       {source}")
    print(f"family:         {family.name} ({family.models}){_how_chosen(args.family, tokenizer.chat_template)}")
    print(f"tool calls:     parser {family.parser!r}")
    options = ", ".join(f"{k}={v!r}" for k, v in renderer.template_kwargs.items()) or "none"
    print(f"options:        {options}")
    keep = ", ".join(f"{k}={v!r}" for k, v in family.keep_reasoning.items())
    print(
        f"past reasoning: {'dropped by the template' if family.drops_reasoning else 'kept'}"
        f"{f' (--keep-reasoning passes {keep})' if keep else ''}"
    )
    usable = True
    for label, tools in (("without tools", ()), ("with tools", (_TOOL,))):
        try:
            report = renderer.check_template((), tools)
        except Exception as exc:  # a TemplateError names what the template does wrong
            print(f"{label + ':':15} UNUSABLE: {exc}")
            usable = usable and not tools
            continue
        placement = ""
        if tools:
            placement = (
                "tools via the template's tools=; "
                if report.tools_in_template
                else (
                    "tools described by the parser's fallback in the "
                    f"{'first user message' if family.system == 'first_user' else 'system message'}; "
                )
            )
        mode = "prefix-preserving: turns are appended" if report.incremental else f"segments: {report.reason}"
        print(f"{label + ':':15} {placement}{mode}")
    print()
    segments = sample(renderer, with_tools=usable)
    if usable:  # a conversation where the environment speaks as the user: templates rewrite history here
        print()
        sample(renderer, with_tools=False, show=segments == 1)
    return 0


def _how_chosen(named: str | None, template: Any) -> str:
    from ..chat.families import matched_family

    if named:
        return ", named with --family"
    if matched_family(template if isinstance(template, str) else None) is None:
        return " (fallback: no known family matched the template; name one with --family)"
    return ", detected from the template"


def load(model: str, tokenizer_name: str | None) -> tuple[Any, str]:
    """(tokenizer with the chat template to check, a description of where it came from)."""
    path = Path(model).expanduser()
    if path.is_file():
        text = template_text(model, path)
        if path.suffix == ".json":
            try:
                text = json.loads(text)["chat_template"]
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"{model!r} is JSON without a 'chat_template' string") from None
            if isinstance(text, list):  # named templates: the default one
                text = next((t["template"] for t in text if t.get("name") == "default"), text[0]["template"])
        check_is_template(model, text)
        if tokenizer_name:
            from ..models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer_name)
            base = tokenizer_name
        else:
            from ..testing import make_tokenizer

            tokenizer, base = make_tokenizer(), "rollforge's built-in test tokenizer"
        added = add_control_tokens(tokenizer, text)
        tokenizer.chat_template = text
        return tokenizer, f"{model} with {base}" + (f" (+{added} control tokens from the template)" if added else "")
    if path.suffix in (".jinja", ".j2", ".json") or (model.endswith("/") and not path.exists()):
        raise ConfigError(f"template file {model!r} does not exist")
    from ..models import load_tokenizer

    tokenizer = load_tokenizer(model)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"model {model!r} has no chat template; pass a template file instead")
    return tokenizer, f"{model} (its own tokenizer and template)"


#: Files that are something else than a chat template, whatever braces they hold.
_NOT_TEMPLATES = (".py", ".pyc", ".yaml", ".yml", ".jsonl", ".toml", ".md", ".ipynb", ".safetensors", ".gguf")


_EXPECTED = "expected a Jinja chat template (.jinja), a tokenizer_config.json with 'chat_template', or a model"


def template_text(name: str, path: Path) -> str:
    """The text of a file given as a template; a Python, YAML or weights file, or one that is not
    text, is refused (it would be rendered verbatim and reported as a template that does not work)."""
    if path.suffix.lower() in _NOT_TEMPLATES:
        raise ConfigError(f"{name!r} is not a chat template (a {path.suffix} file): {_EXPECTED}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{name!r} is not a chat template (not UTF-8 text): {_EXPECTED}") from None


def check_is_template(name: str, text: Any) -> None:
    """A template writes something: Jinja text with ``{{ ... }}`` in it."""
    if not isinstance(text, str) or "{{" not in text or "}}" not in text:
        raise ConfigError(f"{name!r} is not a chat template (no Jinja {{{{ ... }}}} in it): {_EXPECTED}")


def add_control_tokens(tokenizer: Any, template: str) -> int:
    """Add the control tokens written in ``template`` that ``tokenizer`` lacks as special tokens;
    the bos/eos the template writes become the tokenizer's."""
    vocab = tokenizer.get_vocab()
    found = list(dict.fromkeys(_CONTROL.findall(template)))
    missing = [t for t in found if t not in vocab or t not in tokenizer.all_special_tokens]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    for attribute, names in (
        ("bos_token", ("begin_of_text", "begin▁of▁sentence", "<bos>", "startoftext")),
        ("eos_token", ("eot_id", "end▁of▁sentence", "<end_of_turn>", "im_end", "<|end|>", "</s>")),
    ):
        match = next((t for t in found if any(n in t for n in names)), None)
        if match:
            setattr(tokenizer, attribute, match)
    return len(missing)


class _Lookup:
    def reset(self, **kwargs) -> None:
        pass

    def lookup(self, x: int) -> str:
        """Look up a number.

        Args:
            x: The number.
        """
        return f"lookup({x}) = {x * 7}"


def sample(renderer: Any, with_tools: bool, show: bool = True) -> int:
    """Roll out a three-turn conversation with a scripted policy and print its segments (or only
    a summary without ``show``); return how many segments it took."""
    from ..backends.scripted import ScriptedBackend
    from ..chat.fidelity import token_fidelity_gap
    from ..envs.base import BaseSession, Environment, Reset, Step
    from ..envs.factory import FactoryEnvironment
    from ..rollout.config import RolloutConfig
    from ..rollout.engine import arollout
    from ..types import Message, Sample, ToolCall

    class Guess(BaseSession):  # without tools: the environment answers in user turns
        turn = 0

        async def reset(self, sample):
            return Reset(prompt=sample.prompt)

        async def step(self, conversation):
            self.turn += 1
            return Step(messages=(Message("user", "Higher."),), terminated=self.turn == 2)

    class Game(Environment):
        def open(self, sample):
            return Guess()

    def reply(request) -> str:
        thought = renderer.reasoning_text(f"Step {request.call + 1}.")
        if with_tools and request.call < 2:
            call = ToolCall("lookup", {"x": request.call + 2}, renderer.family.call_id(0, request.call, 0))
            return thought + renderer.call_text(call)
        return thought + ("It is 21." if with_tools else f"{request.call + 1}")

    env = FactoryEnvironment(_Lookup) if with_tools else Game()
    config = RolloutConfig(max_turns=3, max_new_tokens=256, max_seq_len=8192, concurrency=1)
    prompt = [{"role": "user", "content": "What does lookup give for 3?" if with_tools else "Guess a number."}]
    result = asyncio.run(
        arollout([Sample(prompt=prompt)], {"default": env}, ScriptedBackend(reply, renderer), renderer, config)
    )
    trajectory = result.trajectories[0]
    kind = "tool" if with_tools else "(no tools)"
    print(
        f"sample {kind} conversation: {trajectory.turns} turns, {len(trajectory.segments)} segment(s)"
        + ("; policy tokens (trained on) are between ⟦ and ⟧" if show else "")
    )
    for number, segment in enumerate(trajectory.segments if show else ()):
        print(
            f"--- segment {number}: {len(segment.token_ids)} tokens, prompt {segment.prompt_length}, "
            f"{sum(segment.loss_mask)} policy tokens"
        )
        print(marked(renderer, segment.token_ids, segment.loss_mask))
    gap = token_fidelity_gap(trajectory, renderer)
    if trajectory.error is not None:
        print(f"--- the sample failed: {trajectory.error.kind}: {trajectory.error.message}")
    print(f"--- token-exact: {'yes' if gap is None else 'NO: ' + gap}")
    return len(trajectory.segments)


def marked(renderer: Any, ids, mask) -> str:
    """The decoded ids with each run of policy tokens between ⟦ and ⟧."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = renderer.decode(ids[start:i])
            out.append(f"⟦{text}⟧" if mask[start] else text)
            start = i
    return "".join(out)
