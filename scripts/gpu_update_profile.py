"""Time rollforge's policy update on a random-initialised model of a real architecture, by how the
batch is cut into micro-batches: GRPO groups behind their shared prompt (``optim.share_prompts``)
or padded rows, at several ``micro_batch_tokens``. The batch: by default 8 groups x 8 rollouts of
a 110-token prompt and 256 completion tokens (the shape of ``bench gpu``'s grpo section).

    python scripts/gpu_update_profile.py [--model qwen3-0.6b | DIR] [--device cuda] [--groups 8]
        [--group-size 8] [--prompt 110] [--completion 256] [--out DIR]

Prints one line per configuration: seconds of two timed updates (after one untimed), micro-batches
and peak device memory. Measured on an H100 on 2026-11-26 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rollforge.bench.gpu import sections
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.update import TrainedPolicy, UpdateRow, UpdateSettings, policy_update

BUDGETS = (4096, 16384)  # micro_batch_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="qwen3-0.6b", help=f"one of {', '.join(sections.MODELS)}, tiny, or a model directory"
    )
    parser.add_argument("--device", default="cuda")
    for name, default in (("groups", 8), ("group-size", 8), ("prompt", 110), ("completion", 256)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--out", default=None, help="where the model is built (default: a temp dir)")
    args = parser.parse_args()
    where = torch.device(args.device)
    cuda = where.type == "cuda"
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.model)
        if not folder.is_dir():
            folder = Path(args.out or scratch) / args.model
            sections.build_model_dir(args.model, folder, where, seed=0)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(where)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        episodes, advantages = batch(
            model.config.vocab_size, args.groups, args.group_size, args.prompt, args.completion
        )
        weights = TokenMean().weights([e.mask for e in episodes])
        for budget, group in ((b, g) for b in BUDGETS for g in (args.group_size, 1)):

            def update() -> tuple[float, int]:
                began = time.perf_counter()
                stats = policy_update(
                    TrainedPolicy(model, optimizer),
                    episodes,
                    advantages,
                    weights,
                    ClippedPolicyLoss(),
                    UpdateSettings(
                        micro_batch_tokens=budget,
                        pad_id=0,
                        compute_dtype=torch.bfloat16 if cuda else torch.float32,
                        skip_zero_advantage=False,
                    ),
                    group_size=group,
                )
                if cuda:
                    torch.cuda.synchronize(where)
                return time.perf_counter() - began, stats.micro_batches

            if cuda:
                torch.cuda.reset_peak_memory_stats(where)
            update()
            timed = [update() for _ in range(2)]
            peak = torch.cuda.max_memory_allocated(where) / 2**30 if cuda else 0.0
            print(
                f"micro_batch_tokens={budget} group_size={group}: {[round(t, 3) for t, _ in timed]} s, "
                f"micro_batches={timed[0][1]}, peak={peak:.1f} GiB",
                flush=True,
            )


def batch(vocab: int, groups: int, size: int, prompt: int, completion: int) -> tuple[list[UpdateRow], torch.Tensor]:
    """``groups`` x ``size`` rows of random ids (each group one prompt), every completion token in the loss."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(groups):
        shared = torch.randint(0, vocab, (prompt,), generator=generator)
        for _ in range(size):
            ids = torch.cat([shared, torch.randint(0, vocab, (completion,), generator=generator)])
            mask = torch.cat([torch.zeros(prompt), torch.ones(completion)])
            rows.append(UpdateRow(ids, mask, torch.zeros(prompt + completion), prompt_length=prompt))
    return rows, torch.randn(len(rows), generator=generator)


if __name__ == "__main__":
    main()
