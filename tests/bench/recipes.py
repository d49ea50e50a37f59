#!/usr/bin/python3
"""recipes.py: training recipes of the same DFlash drafter (SPEC.md 2) on the same work, side by side.

    /usr/bin/python3 tests/bench/recipes.py --ddtreed build-simt/bin/ddtreed [--seconds 36]
        [--qwen35-seconds 12] [--seeds 3] [--targets stories260k,stories260k-greedy,qwen35]
        [--recipes uniform,gamma2x,...] [--keep DIR] [--json FILE] [--from-json FILE]

A recipe is a patch of the run config's "train" object (RECIPES below: uniform anchors as they
are, twice the base's gamma, the walks' anchors of train.anchors with their share, the tree
term of train.tree_weight at two weights). Each one trains the drafter for the same wall time on three targets:
examples/stories260k.json on ../shared/models/stories260k with its sampled data (temperature
0.6), the same on greedy data (temperature 0), and the structured tiny Qwen3.5 of recipe_runs.py
(its own, shorter budget: --qwen35-seconds). As in dflash_vs_dflash2.py, a calibration run per
target and recipe (seed 0, CALIBRATE steps, no evaluation) measures the median step time from
the run's SQLite steps table, then floor(seconds / step time) steps are trained once per seed,
evaluated at their last step only with speculative decoding (SPEC.md 7: tree budgets 8 and 32).
A recipe whose steps cost more reaches fewer of them. Run it on a quiet machine: the step time
is measured, not assumed. It prints the predicted total wall time first (the defaults: about
half an hour on 2 cores), then each run's figures as it finishes.

Prints, per target and recipe: steps reached, the calibration's median step ms, tau_chain,
tau_spec, tau_spec_tree(8) and tau_spec_tree(32) as the mean and the spread (min..max) over the
seeds; then each recipe's differences from uniform seed by seed, mean (min..max), and whether it
beats uniform beyond the seeds' spread on tau_spec and on tau_spec_tree(32): "yes" when it is
above uniform on every seed, "worse" when below on every seed, else "-". The differences are
paired because a seed fixes the held-out prompts as well as the initial weights and the data:
the figures of one recipe spread over the seeds mostly by how hard each seed's prompts are
(examples/stories260k.json's tau_spec, uniform anchors, 36 s: 1.43 to 1.61), far more than the
recipes differ on the same prompts. --json FILE writes every run's figures and the table;
--from-json FILE prints the tables of such a file again without training.
Not a test (its figures are measurements); not in CI (ctest's `long` label). Exit 77 when
../shared's models are absent. Needs numpy for the Qwen3.5 target (the structured checkpoint).
"""
import functools
import json
import os
import sys

from recipe_runs import (CALIBRATE, arguments, calibrate, models_absent, qwen35_config, run_config, seed_runs,
                         spread, steps_for, stories_config, workdir)

DEFAULT_GAMMA = 10.0   # train.gamma when the base leaves it out (ddtreed train --help)
# recipe: the patch of the run config's "train" object, or a function of the base's "train" that gives it
RECIPES = {
    "uniform": {},
    "gamma2x": lambda train: {"gamma": 2 * train.get("gamma", DEFAULT_GAMMA)},
    "walk": {"anchors": "walk", "walk_share": 0.5},
    "walk_all": {"anchors": "walk", "walk_share": 1},
    "tree_walk": {"anchors": "tree_walk", "walk_share": 0.5, "tree_budget": 32},
    "tree_term": {"tree_weight": 1, "tree_budget": 32},
    "tree_term4": {"tree_weight": 4, "tree_budget": 32},
}
BUDGETS = [8, 32]   # the tree budgets every evaluation has


def stories_greedy_config():
    c = stories_config()
    c["name"] = "stories260k-greedy"
    c["target"]["temperature"] = 0
    return c


# target: its base run config (of the work directory), then the seconds a run spends past its
# training time (start and evaluation) and those of a calibration, for the predicted total
TARGETS = {
    "stories260k": (lambda work: stories_config(), 5.0, 4.0),
    "stories260k-greedy": (lambda work: stories_greedy_config(), 5.0, 4.0),
    "qwen35": (qwen35_config, 4.0, 2.0),
}


def with_budgets(base):
    """base with BUDGETS among its evaluation's tree budgets, speculative decoding's included"""
    ev = base.setdefault("eval", {})
    for e in (ev, ev.setdefault("speculative", {})):
        e["tree_budgets"] = sorted(set(e.get("tree_budgets", [])) | set(BUDGETS))
    return base


def recipe_config(base, recipe, seed, steps, evaluate):
    c = run_config(base, f"{base['name']}-{recipe}-s{seed}", seed, steps, evaluate)
    patch = RECIPES[recipe]
    c["train"].update(patch(base["train"]) if callable(patch) else patch)
    return c


def deltas(runs, uniform, key):
    """key's differences from uniform's run of the same seed (the same initial weights, data and
    held-out prompts), seeds where both have it"""
    return [r[key] - u[key] for r, u in zip(runs, uniform) if r[key] is not None and u[key] is not None]


def beats(runs, uniform, key):
    """yes when the recipe is above uniform on key for every seed, worse when below for every seed"""
    d = deltas(runs, uniform, key)
    if not d:
        return "-"
    return "yes" if min(d) > 0 else "worse" if max(d) < 0 else "-"


def print_tables(table, seeds):
    """the figures per target and recipe, then their differences from uniform seed by seed"""
    keys = ("tau_chain", "tau_spec", "tau_spec_tree8", "tau_spec_tree32")
    print(f"\nTraining recipes, the same training time, {seeds} seeds: mean (min..max)")
    print(f"{'target':18} {'recipe':10} {'s':>4} {'steps':>6} {'step ms':>8}  {'tau_chain':>20} {'tau_spec':>20} "
          f"{'tau_spec_tree(8)':>20} {'tau_spec_tree(32)':>20}")
    for row in table:
        print(f"{row['target']:18} {row['recipe']:10} {row['seconds']:4.0f} {row['steps']:6d} {row['step_ms']:8.1f}  " +
              " ".join(f"{spread([r[k] for r in row['runs']]):>20}" for k in keys))
    print("\nThe same as differences from uniform seed by seed (a seed fixes the initial weights, the data and "
          "the held-out prompts): mean (min..max); beats uniform on every seed (tau_spec, tau_spec_tree(32))")
    print(f"{'target':18} {'recipe':10}  {'tau_chain':>22} {'tau_spec':>22} {'tau_spec_tree(8)':>22} "
          f"{'tau_spec_tree(32)':>22}  {'spec':>5} {'tree32':>6}")
    for row in table:
        uniform = next((r["runs"] for r in table if r["target"] == row["target"] and r["recipe"] == "uniform"), None)
        if uniform is None or row["recipe"] == "uniform":
            continue
        row["beats_uniform"] = {k: beats(row["runs"], uniform, k) for k in ("tau_spec", "tau_spec_tree32")}
        print(f"{row['target']:18} {row['recipe']:10}  " +
              " ".join(f"{spread(deltas(row['runs'], uniform, k), signed=True):>22}" for k in keys) +
              f"  {row['beats_uniform']['tau_spec']:>5} {row['beats_uniform']['tau_spec_tree32']:>6}")


def seconds_of(args, target):
    return args.qwen35_seconds if target == "qwen35" else args.seconds


def predicted_s(args, targets, recipes):
    """the wall time of the whole comparison, from TARGETS' overheads"""
    return sum(len(recipes) * (TARGETS[t][2] + args.seeds * (seconds_of(args, t) + TARGETS[t][1])) for t in targets)


def main():
    ap = arguments(__doc__.split("\n\n")[0], 36.0, ",".join(TARGETS))
    ap.add_argument("--recipes", default=",".join(RECIPES), help="of " + ", ".join(RECIPES))
    ap.add_argument("--json", help="a file to write every run's figures and the table to")
    ap.add_argument("--from-json", help="print the tables of an earlier run's --json file, train nothing")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            done = json.load(f)
        print_tables(done["table"], done["seeds"])
        return 0
    targets, recipes = args.targets.split(","), args.recipes.split(",")
    for names, known in ((targets, TARGETS), (recipes, RECIPES)):
        if set(names) - set(known):
            ap.error(f"unknown: {', '.join(sorted(set(names) - set(known)))} (of {', '.join(known)})")
    if models_absent():
        return 77
    print(f"# {len(targets) * len(recipes) * args.seeds} runs and {len(targets) * len(recipes)} calibrations: "
          f"about {predicted_s(args, targets, recipes) / 60:.0f} minutes", flush=True)
    table = []   # {target, recipe, seconds, steps, step_ms, peak_bytes, runs}
    with workdir(args.keep, "ddtree_recipes_") as work:
        for target in targets:
            base = with_budgets(TARGETS[target][0](work))
            seconds = seconds_of(args, target)
            for recipe in recipes:
                make = functools.partial(recipe_config, base, recipe)
                step_ms, peak = calibrate(args.ddtreed, make, os.path.join(work, target, recipe, "calibrate"))
                steps = steps_for(seconds, step_ms)
                print(f"# {target} {recipe}: {step_ms:.1f} ms a step over {CALIBRATE}, {steps} steps", flush=True)
                runs = seed_runs(args.ddtreed, make, steps, args.seeds, seconds, os.path.join(work, target, recipe),
                                 f"{target} {recipe}")
                table.append({"target": target, "recipe": recipe, "seconds": seconds, "steps": steps,
                              "step_ms": step_ms, "peak_bytes": peak, "runs": runs})
    print_tables(table, args.seeds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": args.seconds, "qwen35_seconds": args.qwen35_seconds, "seeds": args.seeds,
                       "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
