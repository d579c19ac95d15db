"""Benchmark: the training objective's label-smoothed cross entropy, forward and backward, on one update's logits.

    .venv/bin/python bench/train_loss.py [--rows 1950] [--vocab 8001] [--threads 2] [--repeats 21]

Times `stages.train.loss.SmoothedCrossEntropy` (what a CPU run trains with) against PyTorch's
`F.cross_entropy(logits.float(), label_smoothing=...)` (what a GPU run uses, and what CPU runs used before it), each
a forward and a backward of the summed loss scaled by 1 / rows as the training loop scales it, on random logits of
`--rows` real target tokens by `--vocab` pieces (the defaults: one update of the Multi30k cpu-ref config, 2048
padded tokens a batch, 8000 joint pieces), in bf16 (the logits autocast gives) and fp32. The two run in alternating
order, `--repeats` times each after two unmeasured rounds; the medians and their ratio are printed, and the largest
difference of the two gradients. `--baseline-rev REV` also times `SmoothedCrossEntropy` as the commit REV has it
(read with `git show`), in the same rounds: a change to the loss measured against its predecessor in one process.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1950, help="real target tokens of an update")
    parser.add_argument("--vocab", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--smoothing", type=float, default=0.1)
    parser.add_argument("--baseline-rev", default=None, metavar="REV", help="also time the loss of this commit")
    return parser.parse_args()


def loss_at_revision(rev: str) -> Callable:
    """SmoothedCrossEntropy.apply as stages/train/loss.py is at commit `rev`."""
    source = subprocess.run(["git", "show", f"{rev}:stages/train/loss.py"], cwd=REPO, capture_output=True, text=True)
    if source.returncode != 0:
        sys.exit(f"--baseline-rev {rev}: {source.stderr.strip()}")
    path = Path(tempfile.mkdtemp(prefix="loss-baseline-")) / "loss_baseline.py"
    path.write_text(source.stdout, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("loss_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SmoothedCrossEntropy.apply


def timed_step(loss_fn: Callable, base, target, smoothing: float) -> tuple[float, object]:
    """Seconds of one forward and backward from `base` (copied first, untimed); returns them and the gradient."""
    logits = base.clone().requires_grad_()
    start = time.perf_counter()
    (loss_fn(logits, target, smoothing) * (1.0 / base.shape[0])).backward()
    return time.perf_counter() - start, logits.grad


def main() -> None:
    args = arguments()
    import torch
    import torch.nn.functional as F

    from stages.train.loss import SmoothedCrossEntropy

    torch.set_num_threads(args.threads)
    trainers = {
        # Told the factor the loss is scaled by, as the loop tells it (the earlier losses took none).
        "ours": lambda x, t, s: SmoothedCrossEntropy.apply(x, t, s, 1.0 / args.rows),
        "pytorch": lambda x, t, s: F.cross_entropy(x.float(), t, label_smoothing=s, reduction="sum"),
    }
    if args.baseline_rev:
        trainers["baseline"] = loss_at_revision(args.baseline_rev)
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(0, args.vocab, (args.rows,), generator=generator)
    figures: dict[str, object] = {"rows": args.rows, "vocab": args.vocab, "threads": args.threads,
                                  "repeats": args.repeats, "torch": torch.__version__}
    print(f"{args.rows} x {args.vocab} logits, {args.threads} thread(s), forward + backward, median of {args.repeats}")
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32")
        base = (torch.randn(args.rows, args.vocab, generator=generator) * 3).to(dtype)
        times: dict[str, list[float]] = {key: [] for key in trainers}
        grads = {}
        for round_index in range(args.repeats + 2):
            order = list(trainers) if round_index % 2 else list(reversed(trainers))  # no one always first
            for key in order:
                seconds, grads[key] = timed_step(trainers[key], base, target, args.smoothing)
                if round_index >= 2:
                    times[key].append(seconds)
        medians = {key: statistics.median(values) for key, values in times.items()}
        ratio = medians["pytorch"] / medians["ours"]
        gap = (grads["ours"].float() - grads["pytorch"].float()).abs().max().item()
        print(f"  {name}: ours {medians['ours'] * 1e3:.2f} ms, PyTorch {medians['pytorch'] * 1e3:.2f} ms "
              f"({ratio:.2f}x); largest gradient difference {gap:.2e}")
        if args.baseline_rev:
            figures[f"{name}_baseline_ms"] = round(medians["baseline"] * 1e3, 2)
            figures[f"{name}_speedup_vs_baseline"] = round(medians["baseline"] / medians["ours"], 3)
            print(f"        {args.baseline_rev}'s loss {medians['baseline'] * 1e3:.2f} ms: ours "
                  f"{medians['baseline'] / medians['ours']:.2f}x")
        figures[f"{name}_ours_ms"] = round(medians["ours"] * 1e3, 2)
        figures[f"{name}_pytorch_ms"] = round(medians["pytorch"] * 1e3, 2)
        figures[f"{name}_speedup"] = round(ratio, 3)
        figures[f"{name}_max_grad_difference"] = gap
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
