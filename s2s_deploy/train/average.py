"""Weight averaging of checkpoints of one model: the epochs of a run (stochastic weight averaging),
or a fine-tune with the weights it started from (WiSE-FT). Averages of fine-tunes that share a start
lie in one basin, so the average generalises better than the parts (Wortsman et al., 2022); the
bundled speech model is such an average (docs/speech.md).

    python -m s2s_deploy.train.average OUT.safetensors A.safetensors:0.5 B.safetensors:0.25 ...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import sha256_of
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint, save_checkpoint


def average_checkpoints(parts: Sequence[tuple[Path, float]], out: Path, info: dict[str, Any] | None = None) -> Path:
    """``out``: the weighted mean of ``parts``' float tensors (weights normalised to sum 1, summed in
    float64), refused in one line unless every part has the first's architecture, config and
    vocabularies. Its info lists each part's path, sha256, weight, epoch and command."""
    if not parts:
        raise S2SError("average: name at least one checkpoint")
    if any(not 0 < weight < math.inf for _, weight in parts):  # inf would make every weight nan
        raise S2SError("average: every weight must be positive and finite")
    total = sum(weight for _, weight in parts)
    first = load_checkpoint(parts[0][0])
    sums: dict[str, torch.Tensor] = {}
    record = []
    for path, weight in parts:
        part = first if path == parts[0][0] else load_checkpoint(path)
        for what, mine, theirs in (("architecture", part.arch, first.arch), ("config", part.config, first.config),
                                   ("source vocabulary", part.src_vocab.tokens, first.src_vocab.tokens),
                                   ("target vocabulary", part.tgt_vocab.tokens, first.tgt_vocab.tokens)):
            if mine != theirs:
                raise S2SError(f"average: {path} has another {what} than {parts[0][0]}")
        for name, tensor in part.tensors.items():
            if tensor.is_floating_point():
                sums[name] = sums.get(name, 0) + tensor.double() * (weight / total)
        record.append({"path": str(path), "sha256": sha256_of(Path(path)), "weight": weight / total,
                       "epoch": part.info.get("epoch"), "command": part.info.get("command")})
    plugin = get_plugin(first.arch)
    model = build_model(first, plugin)
    model.load_state_dict({name: mean.to(first.tensors[name].dtype) for name, mean in sums.items()}, strict=False)
    return save_checkpoint(out, plugin, first.config, model, first.src_vocab, first.tgt_vocab,
                           {**(info or {}), "averaged": record})


def _part(text: str) -> tuple[Path, float]:
    path, _, weight = text.rpartition(":")
    if not path:
        return Path(text), 1.0
    try:
        return Path(path), float(weight)
    except ValueError:
        return Path(text), 1.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2s_deploy.train.average", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the averaged checkpoint")
    parser.add_argument("parts", nargs="+", metavar="CHECKPOINT[:WEIGHT]", help="weight 1 where none is given")
    parser.add_argument("--note", default=None, help="why: kept in the checkpoint's info")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        average_checkpoints([_part(p) for p in args.parts], args.out,
                            {"command": " ".join(["python -m s2s_deploy.train.average", *argv])}
                            | ({"note": args.note} if args.note else {}))
    except (S2SError, OSError) as error:  # OSError: the output's folder cannot be written
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out), "sha256": sha256_of(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
