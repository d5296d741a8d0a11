"""``elastico train-iac``: arguments checked before torch is imported.

``--help`` and every argument error work on an install without the ``[train]`` extra;
only a valid request imports :mod:`elastico_extender.interference.train` (torch), and a
missing torch is one clear line naming the CPU build to install, not a traceback.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from elastico_extender.userfiles import check_writable, reason

__all__ = ["EXTRA_HINT", "TORCH_HINT", "main", "parser"]

EXTRA_HINT = "pip install 'elastico-extender[train]'"
TORCH_HINT = (
    "train-iac needs torch (the CPU build is enough): "
    f"pip install torch --index-url https://download.pytorch.org/whl/cpu && {EXTRA_HINT}"
)
# TrainConfig's defaults, repeated here so --help needs no torch (a test keeps them equal).
DEFAULT_EPOCHS = 400
DEFAULT_HIDDEN = 64
DEFAULT_SEED = 0


MAX_HIDDEN = 4096
"""Widest hidden layer: the net is 36 -> hidden -> hidden -> 1, so its weights grow as
hidden squared (4096: 16.8 M, 67 MB; the 100,000 once allowed asked for 40 GB)."""


SEED_RANGE = (-(2**63), 2**64 - 1)
"""What torch.manual_seed takes (outside it a RuntimeError, after torch is loaded)."""


def _whole(maximum: int, minimum: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be {minimum}..{maximum}, got {value}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elastico train-iac",
        description="Train the IAC slowdown DNN on pair measurements and export it to ONNX "
        "(needs torch: pip install 'elastico-extender[train]', CPU build, docs/install.md).",
    )
    p.add_argument(
        "--csv",
        action="append",
        type=Path,
        help="pair CSV (repeatable; the project's format, or Lucid's co-location and solo "
        "tables together: interference/lucid_tables.py; default: the shipped Gavel pairs)",
    )
    p.add_argument(
        "--from-store",
        type=Path,
        metavar="SQLITE",
        help="train on the pair samples the closed loop collected in this store "
        "(profiles.loop_store) instead of CSVs",
    )
    p.add_argument("--out", type=Path, required=True, help="ONNX file to write")
    p.add_argument("--epochs", type=_whole(100_000), default=DEFAULT_EPOCHS)
    p.add_argument(
        "--hidden",
        type=_whole(MAX_HIDDEN),
        default=DEFAULT_HIDDEN,
        help=f"width of both hidden layers (default {DEFAULT_HIDDEN}, at most {MAX_HIDDEN})",
    )
    p.add_argument("--seed", type=_whole(SEED_RANGE[1], SEED_RANGE[0]), default=DEFAULT_SEED)
    return p


def _is_observation_store(path: Path) -> bool:
    """Whether ``path`` is an SQLite file holding the closed loop's samples, read without
    writing: opening another program's database as a store would add the store's tables
    to it."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='loop_samples'"
            ).fetchone()
        finally:
            db.close()
    except sqlite3.Error:  # not SQLite, damaged, unreadable
        return False
    return found is not None


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    for csv in args.csv or []:
        if not csv.is_file():
            p.error(f"--csv: {csv} is not a readable file")
    if args.from_store is not None:
        if args.csv:
            p.error("--from-store and --csv are exclusive")
        if not args.from_store.is_file():
            p.error(f"--from-store: {args.from_store} is not a readable file")
        if args.from_store.stat().st_size == 0:  # opening it would write a store's schema
            p.error(f"--from-store: {args.from_store} is empty, not an observation store")
        if not _is_observation_store(args.from_store):
            p.error(f"--from-store: {args.from_store} is not an observation store")
    try:  # now, not after minutes of training
        check_writable(args.out)
    except OSError as exc:
        p.error(f"--out: cannot write {args.out}: {reason(exc)}")
    try:
        from elastico_extender.interference import train
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in ("", "torch"):
            print(f"elastico train-iac: {TORCH_HINT} ({exc})", file=sys.stderr)
        else:  # torch is there; another part of the [train] extra (onnx) is not
            print(f"elastico train-iac: train-iac needs {missing}: {EXTRA_HINT}", file=sys.stderr)
        return 2
    config = train.TrainConfig(hidden=args.hidden, epochs=args.epochs, seed=args.seed)
    if args.from_store is not None:
        return train.run_from_store(args.from_store, args.out, config)
    return train.run(args.csv, args.out, config)
