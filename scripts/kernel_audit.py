"""Long run of the differential kernel tester (issue 49, part 1).

    python scripts/kernel_audit.py --networks 200 --seed 0 [--width 256] [--draws 300] [--mlps 40]
                                   [--family dense|conv|attention|multi]

Draws N networks of one family from the grammar of tests/_kernel_grammar.py (network i from
random.Random(seed * 100003 + i), recorded per network), runs both engines and Monte Carlo on each, and prints a
table: generated, accepted and refused per engine, crashes (unclear errors), stax-vs-traced mismatches, Monte-Carlo
mismatches. Families: ``dense`` (the default: vectors, Dense / activations / LayerNorm / residual blocks), ``conv``
(5 x 5 x 2 images: convolutions, pooling, LayerNorm over channels or positions and channels, convolutional
residual blocks, Flatten or GlobalAvgPool), ``attention`` (5 x 3 sequences: self-attention, residual attention,
Dense per position, LayerNorm, GlobalAvgPool or Flatten), ``multi`` (two inputs through their own branches, then
summed, multiplied or concatenated; traced also gets the tuple of inputs, eagerly and jitted, recorded as
``traced_tuple`` and ``traced_tuple_jit``). The new families count a refusal raised from inside numpy or JAX as a
crash, jit both kernels and test a Monte-Carlo mismatch again on networks 4 times wider, which decide (finite-width
bias falls like 1 / width, a wrong kernel stays wrong; the table counts those passed so;
``_kernel_grammar.AUDIT_OPTIONS``). With --mlps M it also measures the z-test's
false-alarm rate on M Dense-act-(Dense-act)-Dense MLPs with closed-form kernels (known to be right). Writes
records/audit/kernel_audit.json (``--out``) after every network; run again with the same settings, it resumes where
it stopped (a file written before --family existed is a dense run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

import _kernel_grammar as g  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--max-blocks", type=int, default=4)
    ap.add_argument("--mlps", type=int, default=40, help="closed-form MLPs for the false-alarm rate (0: none)")
    ap.add_argument("--family", choices=g.FAMILIES, default="dense", help="which networks to draw (default dense)")
    ap.add_argument("--out", default=os.path.join(ROOT, "records", "audit", "kernel_audit.json"))
    args = ap.parse_args(argv)
    x = g.inputs()
    t0 = time.time()
    records, mlp_records = [], []
    # resume: a run interrupted with the same settings keeps the networks it finished
    same = ("seed", "width", "draws", "max_blocks", "mlps", "family")
    if os.path.exists(args.out):
        with open(args.out) as fh:
            old = json.load(fh)
        old_args = {"family": "dense", **old.get("args", {})}   # files from before --family are dense runs
        if all(old_args.get(k) == getattr(args, k) for k in same):
            records, mlp_records = old.get("networks", []), old.get("mlps", [])
            print(f"resuming {args.out}: {len(mlp_records)} MLPs and {len(records)} networks done", flush=True)

    def save(table=None):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "complete": table is not None, "table": table, "networks": records,
                       "mlps": mlp_records}, fh, indent=1, default=str)
    for i in range(len(mlp_records), args.mlps):
        net_seed = 10**7 + args.seed * 100003 + i
        spec = g.draw_mlp(g.Chooser(random.Random(net_seed)))
        rec = g.audit_one(spec, x, width=args.width, draws=args.draws, seed=net_seed)
        rec["failures"] = g.failures(rec)
        mlp_records.append(rec)
        verdict = f"FALSE ALARM {rec['failures']}" if rec["failures"] else "ok"
        print(f"[mlp {i}] seed={net_seed} {rec['spec']} {verdict}", flush=True)
        save()
        jax.clear_caches()

    records = records[:args.networks]
    options = g.AUDIT_OPTIONS[args.family]
    for i in range(len(records), args.networks):
        net_seed = args.seed * 100003 + i
        spec = g.draw_family(args.family, g.Chooser(random.Random(net_seed)), max_blocks=args.max_blocks)
        xs = x if args.family == "dense" else g.family_inputs(spec)
        rec = g.audit_one(spec, xs, width=args.width, draws=args.draws, seed=net_seed, **options)
        rec["failures"] = g.failures(rec)
        records.append(rec)
        flag = "FAIL " + "; ".join(rec["failures"]).replace("\n", " ")[:300] if rec["failures"] else ""
        print(f"[{i}] seed={net_seed} {rec['spec']} stax={rec['stax_status']} traced={rec['traced_status']} "
              f"{flag}", flush=True)
        save()
        jax.clear_caches()
    return report(records, mlp_records, t0, save, args.out)


def report(records, mlp_records, t0, save, out):
    def count(pred, recs=records):
        return sum(1 for r in recs if pred(r))

    table = {
        "generated": len(records),
        "stax accepted": count(lambda r: r["stax_status"] == "accepted"),
        "stax refused (clear)": count(lambda r: r["stax_status"] == "refused"),
        "stax crashed (unclear)": count(lambda r: r["stax_status"] == "crash"),
        "traced accepted": count(lambda r: r["traced_status"] == "accepted"),
        "traced refused (clear)": count(lambda r: r["traced_status"] == "refused"),
        "traced crashed (unclear)": count(lambda r: r["traced_status"] == "crash"),
        "both accepted": count(lambda r: "diff" in r),
        "stax-vs-traced mismatches": count(lambda r: "diff" in r and not r["diff"]["ok"]),
        "stax vs MC mismatches": count(lambda r: not r.get("mc_stax", {"ok": True})["ok"]),
        "traced-only vs MC mismatches": count(lambda r: not r.get("mc_traced", {"ok": True})["ok"]),
    }
    if any("first" in r.get(f"mc_{n}", {}) for r in records for n in ("stax", "traced")):
        # a mismatch at --width that the same test passes on networks 4 times wider: finite-width bias
        table["MC mismatches passed on 4x wider networks"] = count(
            lambda r: any("first" in r.get(f"mc_{n}", {}) and r[f"mc_{n}"]["ok"] for n in ("stax", "traced")))
    for tag, what in (("traced_tuple", "tuple input"), ("traced_tuple_jit", "tuple input, jitted")):
        if any(f"{tag}_status" in r for r in records):   # two-input networks: traced given the tuple itself
            for status, label in (("accepted", "accepted"), ("refused", "refused (clear)"),
                                  ("crash", "crashed (unclear)")):
                table[f"traced ({what}) {label}"] = count(lambda r: r.get(f"{tag}_status") == status)
            table[f"traced ({what}) vs concatenated mismatches"] = count(
                lambda r: not r.get(f"{tag}_diff", {"ok": True})["ok"])
    alarms = count(lambda r: bool(r["failures"]), mlp_records)
    table["MLPs for false-alarm rate"] = len(mlp_records)
    table["MLP false alarms"] = alarms
    width = max(len(k) for k in table)
    print()
    for k, v in table.items():
        print(f"{k:<{width}}  {v}")
    if mlp_records:
        print(f"z-test false-alarm rate on closed-form MLPs: {alarms}/{len(mlp_records)} = "
              f"{alarms / len(mlp_records):.3f}")
    print(f"seconds: {time.time() - t0:.0f}")
    save(table)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
