"""``bench gpu``'s generation candidates on any model rollforge can load (a name, an alias such as
``smollm2-135m``, a directory), on this machine's device: the CPU comparison of issue 37.

    python scripts/generation_candidates.py --model smollm2-135m --rows 16 --new-tokens 64 --prompt-tokens 128

Prints the section's JSON (``rollforge.bench.gpu.generation.run``): every candidate's tokens/s, ms
per decode step and floor fraction on the same requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from rollforge.bench.gpu import generation
from rollforge.bench.gpu.settings import FULL
from rollforge.models import resolve_device, resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = dataclasses.replace(
        FULL,
        batch_size=args.rows,
        generations=1,
        max_new_tokens=args.new_tokens,
        gen_prompt_tokens=args.prompt_tokens,
        seed=args.seed,
    )
    result = generation.run(resolve_model(args.model), resolve_device(args.device), settings)
    result["threads"] = torch.get_num_threads()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
