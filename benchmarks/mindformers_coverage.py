"""``autotune init --mindformers`` over every training config of a MindFormers source tree.

    .venv/bin/python benchmarks/mindformers_coverage.py --git-dir MINDFORMERS.git --ref master

extracts ``configs/`` and ``research/`` of ``--ref`` (``git archive``) into a temporary folder,
keeps the training configs (their merged ``run_mode`` is ``train`` or ``finetune``), and runs
``autotune init --mindformers CONFIG --backend simulate`` on each, as a user would — no flag
but the backend, a process each (``python -m autotune``), from the tree's root (MindFormers'
working directory, against which a relative ``pretrained_model_dir`` is read). A config whose
``pretrained_model_dir`` is a placeholder is run a second time pointed at the Hugging Face
folder :data:`FOLDERS` names for it (tests/fixtures/huggingface/), through a config layered
over it by ``base_config`` (MindFormers' chain; the config itself unchanged).

It prints a Markdown table per folder of the tree: training configs, read, refused by the key
the refusal names; and any traceback or timeout (there should be none). docs/mindformers.md
holds its output for ``master`` and ``r1.8.0``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.spec.errors import SpecError  # noqa: E402
from autotune.spec.mindformers_file import load_config  # noqa: E402

HF = ROOT / "tests" / "fixtures" / "huggingface"
# the Hugging Face folder a placeholder pretrained_model_dir stands for: the one it names, or the
# model a template is for (Qwen3-8B, MindFormers' dense mcore model that trains; Qwen3-30B-A3B,
# its mixture of experts: configs/qwen3_moe)
FOLDERS = {
    "configs/qwen3/finetune_qwen3.yaml": "Qwen3-32B",
    "configs/general/llm_finetune_dense_template.yaml": "Qwen3-8B",
    "configs/general/llm_pretrain_dense_template.yaml": "Qwen3-8B",
    "configs/general/llm_finetune_moe_template.yaml": "Qwen3-30B-A3B",
    "configs/general/llm_pretrain_moe_template.yaml": "Qwen3-30B-A3B",
}
TRAINING = ("train", "finetune")


def extract(git_dir: str, ref: str, into: Path) -> None:
    archive = into / "tree.tar"
    subprocess.run(
        ["git", "--git-dir", git_dir, "archive", "-o", str(archive), ref, "configs", "research"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


def run_mode(path: Path) -> str | None:
    try:
        return load_config(path).get("run_mode")
    except SpecError:
        return None


def init(tree: Path, config: Path, out: Path) -> tuple[str, str]:
    """("read", "") or ("refused", "key: what") or ("traceback"/"timeout", tail)."""
    command = [sys.executable, "-m", "autotune", "init", "--mindformers", str(config)]
    command += ["--backend", "simulate", "--out", str(out), "--force"]
    try:
        done = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    if "Traceback" in done.stderr:
        return "traceback", done.stderr[-400:]
    if done.returncode == 0:
        return "read", ""
    error = done.stderr.strip().splitlines()[-1].removeprefix("error: ")
    error = error.removeprefix(f"{config}: ")
    key, _, rest = error.partition(": ")
    return "refused", f"{key}: {rest.split(': ')[0][:70]}"


def survey(tree: Path) -> list[dict]:
    rows = []
    out = tree / "out.model.yaml"
    for config in sorted(tree.glob("[cr]*/**/*.y*ml")):
        rel = config.relative_to(tree).as_posix()
        mode = run_mode(config)
        if mode not in TRAINING:
            continue
        folder = "/".join(rel.split("/")[:2])
        verdict, why = init(tree, config, out)
        row = {"config": rel, "folder": folder, "verdict": verdict, "why": why}
        if rel in FOLDERS:
            layered = tree / f"{config.stem}-with-folder.yaml"
            layered.write_text(
                f"base_config: {config}\npretrained_model_dir: {HF / FOLDERS[rel]}\n"
            )
            row["with_folder"] = init(tree, layered, out)
            row["folder_name"] = FOLDERS[rel]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    by_folder = defaultdict(list)
    for row in rows:
        by_folder[row["folder"]].append(row)
    lines = [
        "| folder | training configs | read | refused: the key named |",
        "| --- | --- | --- | --- |",
    ]
    for folder, group in sorted(by_folder.items()):
        read = sum(r["verdict"] == "read" for r in group)
        refused = defaultdict(int)
        for r in group:
            if r["verdict"] != "read":
                refused[r["why"] if r["verdict"] == "refused" else r["verdict"]] += 1
        folded = [
            f"{r['config'].rsplit('/', 1)[1]} + {r['folder_name']} config.json: "
            + r["with_folder"][0]
            for r in group
            if "with_folder" in r
        ]
        reasons = "; ".join(f"`{w}` ×{n}" if n > 1 else f"`{w}`" for w, n in refused.items())
        if folded:
            reasons += " (" + "; ".join(folded) + ")"
        lines.append(f"| {folder} | {len(group)} | {read} | {reasons} |")
    read = sum(r["verdict"] == "read" for r in rows)
    with_folder = read + sum(r.get("with_folder", ("",))[0] == "read" for r in rows)
    lines.append(
        f"| **all** | {len(rows)} | {read} (with the Hugging Face folders: {with_folder}) | "
        f"{len(rows) - read} |"
    )
    bad = [r for r in rows if r["verdict"] in ("traceback", "timeout")]
    bad += [r for r in rows if r.get("with_folder", ("",))[0] in ("traceback", "timeout")]
    lines.append("")
    lines.append(f"tracebacks or timeouts: {len(bad)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", required=True, help="a MindFormers repository (its .git)")
    parser.add_argument("--ref", default="master", help="branch or commit (default: master)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder)
        extract(args.git_dir, args.ref, tree)
        print(f"{args.ref}:\n\n{table(survey(tree))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
