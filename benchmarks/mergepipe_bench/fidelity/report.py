"""Write the results as Markdown tables and a KL-vs-budget plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

TITLE = "# Fidelity: downstream behaviour of budgeted merges"
DISCUSSION = "## Discussion"  # a hand-written section of an existing report is kept on rewrite


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of values."""
    return statistics.median(values), min(values), max(values)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}"


def _rand(row: dict[str, Any], get: Any) -> str:
    vals = [get(r) for r in row["random"]]
    if not vals:
        return "-"
    med, lo, hi = _spread(vals)
    return f"{_fmt(med)} [{_fmt(lo)}, {_fmt(hi)}]"


def headline(op: dict[str, Any], scope: str = "answer") -> str:
    """One sentence: at how many budgets below 1 the utility plan beats the random median."""
    rows = [r for r in op["budgets"] if r["fraction"] < 1.0 and r["random"]]
    if not rows:
        return ""
    wins = [r for r in rows
            if r["utility"]["kl"][scope] < statistics.median(x["kl"][scope] for x in r["random"])]
    best = [r for r in rows
            if r["utility"]["kl"][scope] < min(x["kl"][scope] for x in r["random"])]
    return (f"Utility plan vs random plans of equal bytes ({scope} tokens): lower KL than the "
            f"random median at {len(wins)} of {len(rows)} budgets below 1, lower than every "
            f"random plan at {len(best)} of {len(rows)}.")


def kl_table(op: dict[str, Any], scope: str) -> list[str]:
    """Per budget: KL(full || merge) of the utility plan, the random plans, and the base."""
    base = op["base"]["kl"][scope]
    lines = ["| budget | expert bytes read | KL utility plan | KL random plans, median [min, max] "
             "| random / utility | KL expert-normalized plan | KL base |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in op["budgets"]:
        u = row["utility"]
        ku = u["kl"][scope]
        rand = [r["kl"][scope] for r in row["random"]]
        ratio = (f"{statistics.median(rand) / ku:.1f}x" if rand and ku > 0 else "-")
        lines.append(f"| {row['fraction']:.2f} | {u['expert_bytes_read']:,} | {_fmt(ku)} | "
                     f"{_rand(row, lambda r, s=scope: r['kl'][s])} | {ratio} | "
                     f"{_fmt(row['normalized']['kl'][scope]) if 'normalized' in row else '-'} | "
                     f"{_fmt(base)} |")
    return lines


def param_table(op: dict[str, Any]) -> list[str]:
    """Per budget: relative L2 deviation, bound vs realized, retained utility, accuracy."""
    total = op["full"]["total_utility"]
    lines = ["| budget | rel. L2 dev. utility | rel. L2 dev. random, median | bound | realized "
             "L2 | retained utility (utility / random median) | exact match utility | exact "
             "match random, median |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in op["budgets"]:
        u = row["utility"]
        ru = statistics.median(r["retained_utility"] for r in row["random"]) if row["random"] else 0
        lines.append(
            f"| {row['fraction']:.2f} | {_fmt(u['l2']['rel'])} | "
            f"{_rand(row, lambda r: r['l2']['rel'])} | {_fmt(u['omission_bound'])} | "
            f"{_fmt(u['l2']['abs'])} | {u['retained_utility'] / total:.1%} / {ru / total:.1%} | "
            f"{u['accuracy']['mean']:.1%} | {_rand(row, lambda r: r['accuracy']['mean'])} |")
    return lines


def task_table(op: dict[str, Any]) -> list[str]:
    """Per budget and task: answer-token KL of the utility plan vs the random median."""
    tasks = sorted(op["base"]["kl"]["answer_by_task"])
    lines = ["| budget | " + " | ".join(f"{t} utility / random" for t in tasks) + " |",
             "|---:|" + "---:|" * len(tasks)]
    for row in op["budgets"]:
        cells = []
        for t in tasks:
            u = row["utility"]["kl"]["answer_by_task"][t]
            rs = [r["kl"]["answer_by_task"][t] for r in row["random"]]
            cells.append(f"{_fmt(u)} / {_fmt(statistics.median(rs)) if rs else '-'}")
        lines.append(f"| {row['fraction']:.2f} | " + " | ".join(cells) + " |")
    base = op["base"]["kl"]["answer_by_task"]
    lines.append("| base | " + " | ".join(_fmt(base[t]) for t in tasks) + " |")
    return lines


def composition_table(op: dict[str, Any], key: str) -> list[str]:
    """Per budget: share of the plan's bytes by expert or tensor kind, utility plan vs random."""
    names = sorted({n for row in op["budgets"] for n in row["utility"][key]}
                   | {n for row in op["budgets"] for r in row["random"] for n in r[key]})
    lines = ["| budget | " + " | ".join(f"{n} utility / random" for n in names) + " |",
             "|---:|" + "---:|" * len(names)]
    for row in op["budgets"]:
        u = row["utility"]
        tot_u = sum(u[key].values()) or 1
        cells = []
        for n in names:
            rs = [r[key].get(n, 0) / (sum(r[key].values()) or 1) for r in row["random"]]
            rand = f"{statistics.median(rs):.0%}" if rs else "-"
            cells.append(f"{u[key].get(n, 0) / tot_u:.0%} / {rand}")
        lines.append(f"| {row['fraction']:.2f} | " + " | ".join(cells) + " |")
    return lines


def accuracy_table(res: dict[str, Any]) -> list[str]:
    """Greedy exact match of the base, each expert and each full merge, per task."""
    fam = res["family"]
    tasks = [t for t in fam["base"]["accuracy"] if t != "mean"]
    rows = [("base", fam["base"]["accuracy"])]
    rows += [(f"expert `{e}`", v["accuracy"]) for e, v in fam["experts"].items()]
    rows += [(f"full merge, {op['operator']}", op["full"]["accuracy"]) for op in res["operators"]]
    lines = ["| model | " + " | ".join(tasks) + " | mean |", "|---|" + "---:|" * (len(tasks) + 1)]
    for name, acc in rows:
        lines.append(f"| {name} | " + " | ".join(f"{acc[t]:.1%}" for t in tasks)
                     + f" | {acc['mean']:.1%} |")
    return lines


def plot(res: dict[str, Any], path: Path, scope: str = "answer") -> None:
    """KL(full || merge) vs budget: utility plan, random plans (median, min-max), base line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = res["operators"]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.2 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        rows = [r for r in op["budgets"] if r["fraction"] < 1.0]
        fs = [r["fraction"] for r in rows]
        ax.plot(fs, [r["utility"]["kl"][scope] for r in rows], "o-", label="utility plan")
        if all("normalized" in r for r in rows):
            ax.plot(fs, [r["normalized"]["kl"][scope] for r in rows], "^-.",
                    label="expert-normalized utility (diagnostic)")
        if all(r["random"] for r in rows):
            spread = [_spread([x["kl"][scope] for x in r["random"]]) for r in rows]
            ax.plot(fs, [s[0] for s in spread], "s--", label="random plan, equal bytes (median)")
            ax.fill_between(fs, [s[1] for s in spread], [s[2] for s in spread], alpha=0.25,
                            label="random plans, min-max")
        ax.axhline(op["base"]["kl"][scope], color="k", ls=":", label="base model")
        ax.set_yscale("log")
        ax.set_xlabel("expert-read budget (fraction of the full read)")
        ax.set_ylabel(f"KL(full merge || merge), nats/token ({scope} tokens)")
        ax.set_title(op["operator"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _engine(mach: dict[str, Any]) -> str:
    eng = mach.get("engine") or {}
    if not eng.get("commit"):
        return ""
    dirty = eng.get("uncommitted") or []
    return (f" Engine at commit {eng['commit']}"
            + (f" plus uncommitted changes to {', '.join(dirty)}." if dirty else "."))


def write_report(res: dict[str, Any], md_path: Path, png_path: Path, command: str) -> None:
    """docs/FIDELITY.md-style report of a results dict, and its plot beside it."""
    plot(res, png_path)
    cfg, fam, mach = res["config"], res["family"], res["machine"]
    size = cfg["family"]["size"]
    out = [TITLE, "",
           f"Measured {res['date']} on {mach['platform']}, {mach['cpus']} CPUs "
           f"({mach['torch_threads']} torch thread), torch {mach['torch']}, Python "
           f"{mach['python']}; whole run {res['seconds']:.0f} s (family training "
           f"{fam.get('train_seconds', 0):.0f} s, cached across runs)." + _engine(mach), "",
           "Command:", "", "```", command, "```", "",
           "## Setup", "",
           f"* Family: a byte-level Llama (LlamaForCausalLM, {size['layers']} layers, hidden "
           f"{size['hidden']}, MLP {size['intermediate']}, {size['heads']} heads, untied "
           f"embeddings), pretrained from scratch for {cfg['family']['pretrain']['steps']} steps "
           "on generic synthetic text, then one expert per task fine-tuned from it for "
           f"{cfg['family']['finetune']['steps']} steps (answer-token loss): "
           + ", ".join(f"`{t}`" for t in cfg['family']['tasks'])
           + ". All saved as bf16 safetensors; training seed "
           f"{cfg['family']['seed']} (expert i: seed + 1 + i).",
           f"* Catalog block size {cfg['block_bytes'] // 1024} KiB; merges of all "
           f"{len(fam['experts'])} experts, written in {cfg['out_dtype']} so the numbers "
           "measure the plan, not output rounding (the bf16 rounding floor is given below).",
           f"* Eval: {cfg['eval_per_task']} held-out examples per task (seed "
           f"{cfg['eval_seed']}; training never sees their lines). A task line is a task "
           "prefix then 6 pairs `x f(x)` (e.g. `S:abqr...` for shift), f one of: next letter "
           "on lower case (`shift`), a fixed random permutation of upper case (`cipher`), "
           "x + 3 mod 10 on digits (`modadd`), the closing bracket of `([{<` (`brackets`): "
           "disjoint input alphabets, so the experts are complementary. "
           "KL(full merge || merge) is the mean per-token "
           "teacher-forced KL; *answer* tokens are the six f(x), *all* tokens every next-token "
           "prediction of the line. Exact match: all six f(x) are the argmax (teacher-forced).",
           f"* Random plans: {cfg['random_plans']} per budget (seeds {cfg['random_seed']}.."
           f"{cfg['random_seed'] + cfg['random_plans'] - 1}), each a random subset of the "
           "planner's own candidate blocks, first-fit in shuffled order up to the utility plan's "
           "planned bytes (never more), executed by the same executor. The *expert-normalized* "
           "plan (a diagnostic) takes the same candidates first-fit in order of utility / (its "
           "expert's total utility) per byte, up to the same bytes.", ""]
    out += ["## Models", ""] + accuracy_table(res) + [""]
    for op in res["operators"]:
        params = ", ".join(f"{k}={v}" for k, v in op["params"].items())
        floor = op["rounding_floor"]
        out += [f"## {op['operator']} ({params})", "",
                f"Full read: {op['full']['full_read_bytes']:,} expert bytes in "
                f"{op['full']['candidate_blocks']} candidate blocks. Base vs full merge: KL "
                f"{_fmt(op['base']['kl']['answer'])} (answer tokens), "
                f"{_fmt(op['base']['kl']['all'])} (all tokens); relative L2 "
                f"{_fmt(op['base']['l2']['rel'])}. bf16 rounding floor (same full merge "
                f"written in bf16): KL {_fmt(floor['answer'])} (answer), {_fmt(floor['all'])} "
                "(all).", "",
                headline(op), "",
                "KL(full || merge), answer tokens:", ""] + kl_table(op, "answer") + [
                "", "KL(full || merge), all tokens:", ""] + kl_table(op, "all") + [
                "", "Parameters and accuracy (bound = the planner's omitted-update bound, "
                "additive operators only; realized L2 = ||M_full - M_A||_2):", ""
                ] + param_table(op) + [
                "", "Answer-token KL per task (utility / random median):", ""] + task_table(op) + [
                "", "Share of the plan's bytes by expert (utility / random median):", ""
                ] + composition_table(op, "bytes_by_model") + [
                "", "Share of the plan's bytes by tensor kind (utility / random median):", ""
                ] + composition_table(op, "bytes_by_kind")
        out.append("")
    out += [f"![KL vs budget]({png_path.name})", ""]
    old = md_path.read_text() if md_path.exists() else ""
    if DISCUSSION in old:
        out += [old[old.index(DISCUSSION):].rstrip(), ""]
    md_path.write_text("\n".join(out))
