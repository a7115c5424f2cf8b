"""Scores and tables of `benchmarks/search_efficiency.py` (its module doc defines every column).

Contract: :func:`score` scores one study's runs against a noise-free truth; a :class:`Board`
collects the families, the oracle's and the studies' scores per seed (keeping each truth only
until the studies of its table ended, then deleting a temporary table) and prints the tables
and the summary lines the acceptance of issue 37 reads (:meth:`Board.report`).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

CHECKPOINTS = (5, 10, 15)
BAR, MILD_BAR = 0.97, 0.99  # auto within 10 runs on every judged family; within 5 on mild
LAYOUT_BAR = 0.95  # auto within 5 runs on the median layout family (issue 43)


def score(truth, found: list, runs: int) -> dict:
    """``found`` runs (``[(knobs or key, outcome, measured goodput or None)]`` in order) scored
    against ``truth``: ``{"@k": best noise-free value within k runs, "r99": runs until 0.99
    (runs + 1: never), "rec": noise-free value of the best measured run, "oom": runs out of
    memory}``."""
    best, rec, measured_best, reached, out = 0.0, 0.0, None, None, {}
    for i, (knobs, _, measured) in enumerate(found[:runs], start=1):
        key = knobs if isinstance(knobs, tuple) else truth.key(knobs)
        if key not in truth.value:
            raise RuntimeError(f"a run of {knobs} is not in the truth: the table and code differ")
        value = truth.value[key] / truth.optimum
        best = max(best, value)
        if measured is not None and (measured_best is None or measured > measured_best):
            measured_best, rec = measured, value
        if reached is None and best >= 0.99:
            reached = i
        out[f"@{i}"] = best
    for k in CHECKPOINTS:  # a study that ran fewer keeps what it had
        out.setdefault(f"@{k}", best)
    out["r99"] = reached or runs + 1
    out["rec"], out["oom"] = rec, sum(outcome == "oom" for _, outcome, _ in found[:runs])
    return out


class Board:
    """Families, and every score per family, column and seed (see the module doc)."""

    def __init__(self, labels: list[str], runs: int):
        self.labels, self.runs = labels, runs
        self.columns = [*labels, "oracle"]
        self.families: dict = {}  # (space, family) → (kind, model reach, screen reach, judged)
        self.skipped: list = []
        self.scores: dict = defaultdict(dict)  # ((space, family), column) → {seed: score}
        self.seconds: dict = defaultdict(list)  # column → seconds of each study
        self._open: dict = {}  # (key, seed) → [truth, studies left, temporary table]
        self.started = time.perf_counter()

    def family(
        self, space: str, family: str, kind: str, reach: float, screen: float, judged: bool
    ) -> None:
        self.families[(space, family)] = (kind, reach, screen, judged)

    def skip(self, space: str, family: str, kind: str, reach: float, why: str) -> None:
        self.skipped.append((space, family, kind, reach, why))

    def table(self, key, seed: int, truth, oracle: list, temporary: Path | None) -> None:
        """A table of ``key`` for ``seed``: its truth (kept for its studies) and the oracle's
        runs on it."""
        self.scores[(key, "oracle")][seed] = score(truth, oracle, self.runs)
        self._open[(key, seed)] = [truth, 0, temporary]

    def expect(self, key, seed: int, studies: int) -> None:
        self._open[(key, seed)][1] += studies

    def add(self, ident: tuple, found: list, seconds: float) -> None:
        """One study ended: ``ident`` = (key, seed, column)."""
        key, seed, label = ident
        entry = self._open[(key, seed)]
        self.scores[(key, label)][seed] = score(entry[0], found, self.runs)
        self.seconds[label].append(seconds)
        done = sum(map(len, self.seconds.values()))
        if done % 100 == 0:
            print(f"{done} studies, {time.perf_counter() - self.started:.0f} s", file=sys.stderr)
        entry[1] -= 1
        if entry[1] == 0:
            del self._open[(key, seed)]
            if entry[2] is not None:
                entry[2].unlink()

    # ------------------------------------------------------------ printing

    def median(self, key, column: str, field: str) -> float:
        values = list(self.scores.get((key, column), {}).values())
        return statistics.median(v[field] for v in values) if values else float("nan")

    def _r99(self, key, column: str) -> str:
        r99 = self.median(key, column, "r99")
        return f">{self.runs}" if r99 > self.runs else f"{r99:g}"

    def _kind(self, *kinds) -> list:
        """The families of these kinds (judged ones only, but for engine and real)."""
        return [
            k
            for k, (kind, _, _, judged) in self.families.items()
            if kind in kinds and (judged or kind in ("engine", "real"))
        ]

    def report(self, seeds: range) -> None:
        for space, family, kind, reach, why in self.skipped:
            print(f"not run: {space}/{family} ({kind}, top5 {reach:.2f}): {why}")
        print(
            f"\nbest noise-free value run / noise-free optimum within N runs, median over "
            f"{len(seeds)} seeds ({seeds.start}–{seeds.stop - 1}); top5: the cost model's own top "
            "5 over the optimum; scrn: the best its memory screen admits over the optimum "
            "(first seed); jdg: judged (bar: reported against the oracle's bar)"
        )
        head = f"{'space':<11}{'family':<28}{'kind':<7}{'top5':>5}{'scrn':>5}{'jdg':>4}"
        cols = "".join(f"{c + '@5':>13}{'@10':>6}{'@15':>6}" for c in self.columns)
        print("\n" + head + cols + "\n" + "-" * len(head + cols))
        for key, (kind, reach, screen, judged) in self.families.items():
            cells = "".join(
                f"{self.median(key, c, f'@{k}'):>{13 if k == 5 else 6}.3f}"
                for c in self.columns
                for k in CHECKPOINTS
            )
            mark = "bar" if kind == "engine" else "yes" if judged else "no"
            print(f"{key[0]:<11}{key[1]:<28}{kind:<7}{reach:>5.2f}{screen:>5.2f}{mark:>4}{cells}")
        print(
            f"\nr99: runs until 0.99 of the optimum (>{self.runs}: not within the study), "
            "median; rec: noise-free value of the recommended candidate (its best measured run) "
            f"after {self.runs} runs, median; oom: runs past the memory cap per study, median/max"
        )
        head = f"{'space':<11}{'family':<28}"
        cols = "".join(f"{c:>10}{'r99':>5}{'rec':>6}{'oom':>8}" for c in self.columns)
        print("\n" + head + cols + "\n" + "-" * len(head + cols))
        for key in self.families:
            cells = ""
            for c in self.columns:
                ooms = [v["oom"] for v in self.scores.get((key, c), {}).values()] or [0]
                oom = f"{statistics.median(ooms):g}/{max(ooms)}"
                cells += f"{'':>10}{self._r99(key, c):>5}{self.median(key, c, 'rec'):>6.3f}{oom:>8}"
            print(f"{key[0]:<11}{key[1]:<28}{cells}")
        self.summary()
        print(
            "\nseconds per study (median/max): "
            + ", ".join(
                f"{c} {statistics.median(s):.1f}/{max(s):.1f}" for c, s in self.seconds.items()
            )
        )

    def summary(self) -> None:
        """The lines the acceptance of issue 37 reads."""
        judged, mild = self._kind("mild", "time", "memory", "layout"), self._kind("mild")
        exact = self._kind("mild", "time", "layout")
        print(
            f"\nsummary: {len(judged)} judged families (mild {len(mild)}, memory-exact "
            f"{len(exact)} with mild and layout, layout {len(self._kind('layout'))}, memory "
            f"{len(judged) - len(exact)})"
        )
        for c in self.columns if judged else ():
            at10 = {k: self.median(k, c, "@10") for k in judged}
            met = [k for k, v in at10.items() if v >= BAR]
            kinds = ", ".join(
                f"{kind} {sum(k in met for k in self._kind(kind))}/{len(self._kind(kind))}"
                for kind in ("mild", "time", "memory", "layout")
            )
            studies = [v["@10"] for k in judged for v in self.scores.get((k, c), {}).values()]
            print(
                f"  {c:<8} ≥ {BAR} within 10 runs on {len(met)} of {len(at10)} families "
                f"({len(met) / len(at10):.0%}; {kinds}), in "
                f"{sum(v >= BAR for v in studies)} of {len(studies)} studies; median family @10 "
                f"{statistics.median(at10.values()):.3f}, worst {min(at10.values()):.3f}"
            )
        for c in self.columns if mild else ():
            cells = ", ".join(
                f"{k[0]} @5 {self.median(k, c, '@5'):.3f} r99 {self._r99(k, c)}" for k in mild
            )
            met = sum(self.median(k, c, "@5") >= MILD_BAR for k in mild)
            print(f"  mild: {c:<8} ≥ {MILD_BAR} within 5 on {met} of {len(mild)} ({cells})")
        self._layouts()
        for k in self._kind("engine"):
            bar = BAR * self.median(k, "oracle", "@10")
            cells = ", ".join(f"{c} {self.median(k, c, '@10'):.3f}" for c in self.labels)
            print(f"  {k[0]}/{k[1]} @10, bar {bar:.3f} ({BAR} × oracle@10): {cells}")
        for c in self.labels:
            ooms = [v["oom"] for k in exact for v in self.scores.get((k, c), {}).values()]
            if ooms:
                print(
                    f"  {c:<8} runs past the cap per study on the memory-exact families: max "
                    f"{max(ooms)}, median {statistics.median(ooms):g}; ≤ 1 in "
                    f"{sum(o <= 1 for o in ooms)} of {len(ooms)} studies"
                )
        for c in self.labels:
            one = c.partition(":")[0]
            if ":" in c and one in self.labels and judged:
                mine = statistics.median(self.median(k, c, "@5") for k in judged)
                base = statistics.median(self.median(k, one, "@5") for k in judged)
                print(
                    f"  slots: {c} median family @5 {mine:.3f}, {one} {base:.3f} "
                    f"({mine - base:+.3f})"
                )
        for k in self._kind("real"):
            cells = ", ".join(f"{c} {self.median(k, c, '@5'):.3f}" for c in self.columns)
            print(f"  {k[1]} @5: {cells}")

    def _layouts(self) -> None:
        """The layout families' lines: each column's median family @5 and @10, and, for each
        sampler, the families where ``auto`` is not ahead of it at 10 (and at 5 on the median)."""
        layout = self._kind("layout")
        if not layout:
            return
        for c in self.columns:
            at5 = statistics.median(self.median(k, c, "@5") for k in layout)
            at10 = statistics.median(self.median(k, c, "@10") for k in layout)
            mark = f" (bar {LAYOUT_BAR} @5)" if c == "auto" else ""
            print(f"  layout: {c:<8} median family @5 {at5:.3f}{mark}, @10 {at10:.3f}")
        if "auto" not in self.columns:
            return
        mine5 = statistics.median(self.median(k, "auto", "@5") for k in layout)
        for other in ("tpe", "random"):
            if other not in self.columns:
                continue
            behind = [
                k[0] + "/" + k[1]
                for k in layout
                if self.median(k, "auto", "@10") <= self.median(k, other, "@10")
            ]
            theirs5 = statistics.median(self.median(k, other, "@5") for k in layout)
            print(
                f"  layout: auto ahead of {other} at 10 on {len(layout) - len(behind)} of "
                f"{len(layout)}"
                + (f" (not on {', '.join(behind)})" if behind else "")
                + f"; median family @5 {mine5:.3f} against {theirs5:.3f}"
            )
