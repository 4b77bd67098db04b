r"""The dim(c-hat) ablation of von Kügelgen et al. (2021, Fig. 10): ``rpm content-style`` with a
representation of ``--dims`` dimensions (default 1..10) on one row of the table, and the block
:math:`R^2` of the true content and style against the dimension. Theory: below :math:`n_c` the
representation holds part of the content and no style; above it, the spare dimensions pick up
style.

Usage (the run recorded in ``benchmarks/README.md``)::

    python benchmarks/content_style_dims.py --row independent --steps 1500 --dims 2,4,5,6,8,10

Each run's folder is ``--out``/dims-K; the table is also written to ``--out``/summary.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rpm.cli import main as rpm_main

KEYS = ("content_r2_nonlinear", "content_r2_linear", "style_r2_nonlinear", "style_r2_linear")


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", default="independent",
                        help="row of the table (default: independent)")
    parser.add_argument("--dims", default="1,2,3,4,5,6,7,8,9,10",
                        help="dimensions of c-hat, comma-separated (default: 1..10)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/content-style-dims")
    parser.add_argument("--extra", default="",
                        help="further flags of rpm content-style, e.g. '--batch-size 512'")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> dict:
    """Runs the ablation; prints and returns ``{dims: row}``."""
    out = Path(args.out)
    table = {}
    for dims in [int(d) for d in args.dims.split(",")]:
        folder = out / f"dims-{dims}"
        status = rpm_main(["content-style", "--rows", args.row, "--content-dims", str(dims),
                           "--steps", str(args.steps), "--seed", str(args.seed), "--out",
                           str(folder), "--overwrite", "--no-progress", *args.extra.split()])
        if status:
            raise SystemExit(f"rpm content-style --content-dims {dims} failed ({status})")
        row = json.loads((folder / "results.json").read_text())["rows"][0]
        table[dims] = {key: row[key] for key in (*KEYS, "train_seconds")}
    print(f"{'dim':>4} " + " ".join(f"{key:>21}" for key in KEYS))
    for dims, row in table.items():
        print(f"{dims:>4} " + " ".join(f"{row[key]:>21.3f}" for key in KEYS))
    (out / "summary.json").write_text(json.dumps(table, indent=1))
    return table


if __name__ == "__main__":
    main(parse_args())
