"""τ against training tokens: the scaling curve of heads trained on more and more of the same data.

    python -m experiments.scaling_curve OUT_DIR [OUT_DIR ...] --record docs/scaling-points.json --plot docs/scaling-curve.png

Each OUT_DIR is an `evaluation.parity` output (`--out`) whose runs trained on a slice of one store
(`--epochs 0.125, 0.25, ...`: one pass over that share of its records, the schedule ending with
the run) and were judged alike (the same `--num-prompts` and `--max-new-tokens`). Every judged run
of every folder is one point: its trainer, the tokens it trained on (`run.json`), and τ of vLLM's
3-token chain, of our 3-token chain and of our EAGLE-2 tree. Prints the markdown table; `--plot`
draws τ against tokens on a log axis, one panel per judge, one line per trainer and data (the store's).
An OUT_DIR may also be an `evaluation.acceptance` output (`--out`): each head it judged that keeps
a `training.json` (train/stages.py) is a point of the line "ARCH in stages (JUDGE)" ("ARCH (N layers) ..."
for a head of N > 1 decoder layers), at the distinct
tokens of its stages (a stage over data an earlier stage saw adds none, as does a store gathered from earlier
stages' stores, read from its manifest or named with `--rereads` where the store is gone; a store merged by
`data_prep.merge_stores` adds the stores it links that no earlier stage saw) and the sum of their steps,
so a head trained slice by slice across sessions draws its own curve.
`--record FILE` keeps the points in git (the run outputs stay out of it): the file's points are
read, a folder's points replace the recorded ones of the same folder, trainer, tokens and steps, and the
file is written back, so the figure is redrawn from the record alone (no OUT_DIR) or with new runs added.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from data_prep.store import read_manifest
from train.stages import STAGES_FILE, read_stages

JUDGES = {"vllm_tau": "vLLM k=3", "chain3_tau": "ours, chain 3", "tree_tau": "ours, tree"}


@dataclass
class Point:
    trainer: str
    data: str  # the store's data selection (data_of), e.g. sharegpt_packaged, regen-c0-22-repeats8
    tokens: int
    steps: int
    scores: dict  # judge key -> τ (None: not judged by it)
    folder: Path

    @property
    def line(self) -> str:
        return f"{self.trainer} on {self.data}"

    def to_json(self) -> dict:
        return {**asdict(self), "folder": str(self.folder)}


def in_order(found) -> list[Point]:
    """Points by line (trainer and data), then tokens: the table's and the figure's order."""
    return sorted(found, key=lambda p: (p.line, p.tokens))


def read_record(path: Path) -> list[Point]:
    """The points kept in `path` (a JSON list written by write_record); none when it does not exist."""
    if not path.exists():
        return []
    return [Point(**{**raw, "folder": Path(raw["folder"])}) for raw in json.loads(path.read_text())]


def merged(recorded: list[Point], new: list[Point]) -> list[Point]:
    """The recorded points, each replaced by a new point of the same folder, trainer, tokens and steps, plus the
    other new ones."""
    by_key = {(str(p.folder), p.trainer, p.tokens, p.steps): p for p in recorded}
    by_key.update({(str(p.folder), p.trainer, p.tokens, p.steps): p for p in new})
    return in_order(by_key.values())


def write_record(path: Path, found: list[Point]) -> None:
    path.write_text(json.dumps([p.to_json() for p in found], indent=1) + "\n")


def data_of(command: str) -> str:
    """The data selection of a run's store, from its training command's store_dir=...: the folder's name
    before "-limit", plus "-repeatsN" when its loops left the loss (data.mask_repeats); "?" without one."""
    stores = [w.split("=", 1)[1] for w in command.split() if w.startswith("store_dir=")]
    if not stores:
        return "?"
    name = Path(stores[0]).name
    repeats = [part for part in name.split("-") if part.startswith("repeats")]
    return name.split("-limit")[0] + "".join(f"-{part}" for part in repeats)


def from_scratch(command: str) -> bool:
    """Did the run start from a fresh head (no train.init_head)? A fine-tune is not a point of the curve."""
    return not any(w.startswith("train.init_head=") and w.split("=", 1)[1] not in ("", "null") for w in command.split())


def points(out_dirs: list[Path], known_rereads: frozenset = frozenset()) -> list[Point]:
    """Every judged run of the parity outputs and every staged head of the acceptance outputs in
    `out_dirs`, by line, then tokens."""
    found = []
    for out in out_dirs:
        scores = json.loads((out / "scores.json").read_text()) if (out / "scores.json").exists() else {}
        for run_file in sorted(out.glob("runs/*/run.json")):
            run = json.loads(run_file.read_text())
            judged = [v for k, v in scores.items() if k.split("|")[0] == run["trainer"]]
            if judged and from_scratch(run.get("command", "")):
                found.append(Point(run["trainer"], data_of(run.get("command", "")), int(run["tokens"]),
                                   int(run["recipe"]["steps"]), {k: judged[0].get(k) for k in JUDGES}, out))
        found += staged_points(out, scores, known_rereads)
    return in_order(found)


def staged_points(out: Path, scores: dict, known_rereads: frozenset = frozenset()) -> list[Point]:
    """The heads judged in an acceptance output's `scores` (keys "HEAD_DIR|JUDGE") that keep their stages.
    `known_rereads`: names of stage stores that only re-read earlier stages' data, for stores not on this disk."""
    found = []
    for key, judged in scores.items():
        head, judge = key.split("|", 1)
        stages = read_stages(head) if (Path(head) / STAGES_FILE).is_file() else []
        if not stages:
            continue
        config = json.loads((Path(head) / "config.json").read_text())
        arch, depth = config.get("architecture", "head"), int(config.get("num_hidden_layers", 1))
        arch += f" ({depth} layers)" if depth > 1 else ""  # a deeper head draws a line of its own
        seen = {}  # store (or data) -> tokens, in stage order: a later pass over the same data adds no tokens
        for stage in stages:
            folder = store_of(stage.data)
            source = _source(folder)  # its manifest's, read once a stage
            if not named(stage.data, known_rereads) and not rereads(source, seen):
                for part, tokens in made_of(folder or stage.data, stage.tokens, source):
                    seen.setdefault(part, tokens)
        found.append(Point(f"{arch} in stages ({judge})", stages[0].data.split(" (")[0], sum(seen.values()),
                           sum(s.steps for s in stages), {k: judged.get(k) for k in JUDGES}, out))
    return found


def named(data: str, names: frozenset) -> bool:
    """Is a stage's data ("NAME (FOLDER)") named in `names`, by NAME or by its folder's name?"""
    folder = store_of(data)
    return data.split(" (")[0] in names or (folder is not None and folder.name in names)


def store_of(data: str) -> Path | None:
    """The store folder a stage's data names ("NAME (FOLDER)"), ~ expanded; None without one."""
    if not data.endswith(")") or " (" not in data:
        return None
    return Path(data[data.index(" (") + 2:-1]).expanduser()


def _source(folder: Path | None) -> dict:
    """The `source` of a store's manifest; empty where the store is not on this disk."""
    manifest = read_manifest(folder) if folder else None
    return (manifest or {}).get("source") or {}


def made_of(store: Path | str, tokens: int, source: dict) -> list[tuple[Path | str, int]]:
    """(store folder, tokens) of every store a stage's store (its folder, or its data where it names none) holds:
    those a store merged by `data_prep.merge_stores` links (recursively, `source` being the store's manifest's),
    else the store itself."""
    if not source.get("merged"):
        return [(store, tokens)]
    leaves = []
    for m in source["merged"]:
        linked = Path(m["store"]).expanduser()
        leaves += made_of(linked, m.get("tokens") or (read_manifest(linked) or {}).get("tokens", 0),
                          m.get("source") or {})
    return leaves


def rereads(source: dict, seen: dict) -> bool:
    """Is a stage's store (`source`: its manifest's) built only from files inside stores of earlier stages (e.g.
    their `regenerated/` replies gathered into one store)? Then its tokens are not new."""
    files = [f.strip() for f in str(source.get("data", "")).split(",") if f.strip()]
    earlier = [d for d in seen if isinstance(d, Path)]
    return bool(files) and all(any(Path(f).expanduser().is_relative_to(d) for d in earlier) for f in files)


def table(found: list[Point]) -> str:
    rows = ["| trainer | data | training tokens | steps | " + " | ".join(f"τ {name}" for name in JUDGES.values())
            + " | folder |", "|---|---|---|---|" + "---|" * len(JUDGES) + "---|"]
    for p in found:
        taus = [f"{p.scores[k]:.2f}" if p.scores[k] is not None else "—" for k in JUDGES]
        rows.append(f"| {p.trainer} | {p.data} | {p.tokens:,} | {p.steps} | " + " | ".join(taus) + f" | `{p.folder}` |")
    return "\n".join(rows)


def plot(found: list[Point], path: Path) -> None:
    """One panel per judge that scored any point, τ against tokens on a log axis; a line keeps its colour
    in every panel, and the legend (one entry per line) sits under the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    judges = [key for key in JUDGES if any(p.scores[key] is not None for p in found)]
    lines = sorted({p.line for p in found})
    colours = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, len(judges), figsize=(4.2 * len(judges), 4.2), squeeze=False)
    for ax, key in zip(axes[0], judges):
        for i, line in enumerate(lines):
            mine = [p for p in found if p.line == line and p.scores[key] is not None]
            if mine:
                ax.plot([p.tokens for p in mine], [p.scores[key] for p in mine], "-o", color=colours(i % 10),
                        label=line)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"τ {JUDGES[key]}")
        ax.set_xlabel("distinct training tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("τ (tokens per target forward)")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    fig.legend([handles[line] for line in lines if line in handles], [line for line in lines if line in handles],
               loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * ((len(lines) + 1) // 2), 1, 1))
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.scaling_curve", description=__doc__.splitlines()[0])
    ap.add_argument("out_dirs", nargs="*", type=Path, help="evaluation.parity or evaluation.acceptance output folders")
    ap.add_argument("--record", type=Path, default=None, help="the points kept in git: read, updated, written back")
    ap.add_argument("--plot", type=Path, default=None, help="write the figure here (PNG)")
    ap.add_argument("--rereads", default="", help="comma-separated names (a stage's data name, e.g. regen4, or its "
                    "store folder's) of stage stores built from earlier stages' data, where the store is not on this disk to tell")
    args = ap.parse_args(argv)
    if not args.out_dirs and not args.record:
        ap.error("give output folders, a --record, or both")
    new = points(args.out_dirs, frozenset(n for n in args.rereads.split(",") if n))
    if args.out_dirs and not new:
        raise SystemExit(f"error: no judged runs in {', '.join(map(str, args.out_dirs))}")
    found = merged(read_record(args.record), new) if args.record else new
    if not found:
        raise SystemExit(f"error: no points in {args.record}")
    if args.record:
        write_record(args.record, found)
    print(table(found))
    if args.plot:
        plot(found, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
