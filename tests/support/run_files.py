"""What a finished run leaves, hand-made: metrics/eval.json (one direction on two test sets, and two directions
with their macro average), metrics/train.json and metrics/export.json as the stages write them, and a DVC project
with DVCLive training curves. The card and the `mtpipe summary` / `mtpipe plots` tests read the same run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DVC = Path(sys.executable).with_name("dvc")

SIGNATURES = {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
              "chrf": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
              "ter": "nrefs:1|case:mixed|tok:tercom|norm:no|punct:yes|asian:no|version:2.6.0"}
EVAL = {
    "newstest2014": {"en-de": {"bleu": 27.31, "chrf": 56.2, "ter": 60.5, "length_ratio": 0.987, "sentences": 3003,
                               "signature": SIGNATURES}},
    "flickr2017": {"en-de": {"bleu": 31.5, "chrf": 60.01, "ter": 50.25, "length_ratio": 1.012, "sentences": 1000,
                             "signature": {"bleu": "b", "chrf": "c", "ter": "t"}}},
    "macro": {"bleu": 29.41, "chrf": 58.11, "ter": 55.38},
}
TRAIN = {"steps": 1200, "epochs": 9, "stop_reason": "max_steps", "train_seconds": 287.4, "parameters": 363072,
         "processes": 2, "device": "cuda", "precision": "bf16", "tgt_tokens_per_s": 15800.5, "best_valid_loss": 3.21,
         "best_valid_bleu": 24.7, "final_model": "best valid loss, update 1000"}
EXPORT = {"n_sentences": 64, "onnx": {"encoder_max_abs_diff": 7e-7, "decoder_max_abs_diff": 4e-7},
          "torchscript": {"encoder_max_abs_diff": 0.0}, "identical_share": 1.0, "bleu": {"delta": 0.0},
          "onnx_int8": {"identical_share": 0.875, "bleu_delta": -0.12}}

EVAL_MULTI = {
    "test": {"en-de": {"bleu": 30.12, "chrf": 58.3, "ter": 52.0, "length_ratio": 0.99, "sentences": 1000,
                       "signature": SIGNATURES},
             "en-fr": {"bleu": 40.5, "chrf": 65.25, "ter": 41.5, "length_ratio": 1.01, "sentences": 1000,
                       "signature": SIGNATURES}},
    "macro": {"bleu": 35.31, "chrf": 61.78, "ter": 46.75},
}


def dvclive_project(root: Path) -> Path:
    """A DVC project (no git) with two DVCLive-style curves and the plots section the train stage declares."""
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=root, check=True)
    curves = {"train/loss.tsv": [(0, 9.5), (10, 7.1), (20, 5.0)], "valid/loss.tsv": [(10, 8.0), (20, 6.2)]}
    for name, rows in curves.items():
        path = root / "dvclive" / "plots" / "metrics" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("step\tloss\n" + "".join(f"{step}\t{loss}\n" for step, loss in rows))
    (root / "dvc.yaml").write_text("plots:\n  - dvclive/plots/metrics:\n      x: step\n")
    return root
