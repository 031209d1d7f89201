#!/usr/bin/env python3
"""Interleaved rounds of any benchmark script that takes --variants and --out and writes a JSON with
its "runs", or of the package's own `python -m torch_offload.bench` (--modes and --json): every
variant in its own process (a fresh model, nothing left from another variant), the variants' order
reversed every other round, so that drift of the machine and the position in a round fall on all of
them alike. Per length and variant: step time min / median / max over the rounds and, per round, the
baseline's step over the variant's ("speed x baseline") and the variant's peak over the baseline's,
min / median / max. A ratio whose range holds 1.000 is "equal".

    python3 benchmarks/rounds.py --rounds 3 --baseline ckpt --out DIR -- \\
        python3 benchmarks/bench_selective.py --seqs 16384,65536 --variants ckpt,torch_sac,selective \\
        --warmup 1 --steps 3

    python3 benchmarks/rounds.py --rounds 3 --baseline checkpointing --out DIR -- \\
        python3 -m torch_offload.bench --modes checkpointing,hidden_states_disk --seqs 32768 --steps 4

    python3 benchmarks/rounds.py --rounds 3 --baseline ckpt --out DIR -- \\
        torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py --seqs 16384 \\
        --variants ckpt,hs_after --warmup 1 --steps 2

Under torchrun each variant and round is a launch of its own; its row is the one rank 0 writes (the
worse rank's step).

Each run writes into DIR/round<R>/<variant>/; DIR/rounds.json holds the command, every run (with
the script's own row and the rest of its JSON) and the summary, DIR/rounds.md the table, both
rewritten after every run. --resume continues a run that a time limit stopped: the rounds in
DIR/rounds.json that every variant finished are kept, and the others (a round cut short included,
so that a round's ratios never span two sittings) run again, up to --rounds.
CPU smoke: python benchmarks/rounds.py --rounds 2 --baseline ckpt --out DIR -- python \\
           benchmarks/bench_selective.py --device cpu --tiny --variants ckpt,hidden --steps 1
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path


ORDER = "one process per variant; the variants in the given order in odd rounds, reversed in even rounds"


def variants_of(command: list) -> tuple:
    """The wrapped command's variants, the command without them, and the option that names them:
    --variants (the benchmark scripts) or --modes (the package's bench, whose "modules:" variants
    hold commas of their own and so cannot be run one by one here)."""
    rest, variants, option = [], None, None
    items = iter(command)
    for item in items:
        name, equals, value = item.partition("=")
        if name in ("--variants", "--modes"):
            variants, option = (value if equals else next(items, "")), name
        else:
            rest.append(item)
    if not variants:
        raise SystemExit("rounds.py: the wrapped command needs --variants A,B,... (or --modes A,B,...)")
    if option == "--modes" and "modules:" in variants:
        raise SystemExit("rounds.py: --modes with a modules: variant is not supported; run it on its own")
    if option == "--modes" and any(item == "--json" or item.startswith("--json=") for item in rest):
        raise SystemExit("rounds.py: leave --json out of the wrapped command; each run writes its own")
    return [v for v in variants.split(",") if v], rest, option


def run_command(rest: list, option: str, variant: str, out: Path) -> list:
    """The command that runs `variant` alone, writing its JSON into `out`."""
    where = ["--out", str(out)] if option == "--variants" else ["--json", str(out / "result.json")]
    return [*rest, option, variant, *where]


def orders(variants: list, rounds: int) -> list:
    """(round, variant) in run order: the given order in odd rounds, reversed in even ones."""
    return [(r, v) for r in range(1, rounds + 1) for v in (variants if r % 2 else variants[::-1])]


def complete_rounds(runs: list, variants: list) -> set:
    """The rounds in which every variant measured a step."""
    done = {(r["round"], r["variant"]) for r in runs if "step_s" in r}
    return {n for n, _ in done if all((n, v) in done for v in variants)}


def earlier_rounds(out: Path, command: list, variants: list, rounds: int) -> tuple:
    """(the kept runs, the kept failures, the rounds they cover) of an earlier run of the same
    wrapped command in `out`, rounds 1 to `rounds`, for --resume; nothing when there is none."""
    path = out / "rounds.json"
    if not path.exists():
        return [], [], set()
    earlier = json.loads(path.read_text())
    wrapped = earlier["command"].split(" -- ", 1)[1]
    if wrapped != shlex.join(command):
        raise SystemExit(f"rounds.py --resume: {path} holds rounds of another command: {wrapped}")
    done = {n for n in complete_rounds(earlier["runs"], variants) if n <= rounds}
    failed = [f for f in earlier["failed"] if int(f.split()[1]) in done]  # "round N variant: ..."
    return [r for r in earlier["runs"] if r["round"] in done], failed, done


def measured(run: dict) -> dict:
    """A benchmark's row as (step_s, peak_allocated_GB), whichever names the script gives them;
    {} for a row that failed or measured no step."""
    step = run.get("step_s", run.get("step_s_median"))
    peak = run.get("peak_allocated_GB")
    if peak is None and run.get("peak_alloc") is not None:
        peak = run["peak_alloc"] / 1e9
    if step is None or "error" in run:
        return {}
    return {"step_s": step, "peak_allocated_GB": peak}


def spread(values: list) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list, baseline: str) -> list:
    """One row per (seq, variant): step time and, per round where the baseline ran too, the speed
    and peak ratios against it, min / median / max."""
    by = {(r["seq"], r["variant"], r["round"]): r for r in runs if "step_s" in r}
    rows = []
    for seq, variant in sorted({(s, v) for s, v, _ in by}, key=lambda k: (k[0], k[1] != baseline, k[1])):
        mine = [r for (s, v, _), r in by.items() if (s, v) == (seq, variant)]
        row = {"seq": seq, "variant": variant, "rounds": len(mine), "step_s": spread([r["step_s"] for r in mine])}
        peaks = [r["peak_allocated_GB"] for r in mine if r["peak_allocated_GB"] is not None]
        if peaks:
            row["peak_allocated_GB"] = max(peaks)
        pairs = [(r, by[(seq, baseline, r["round"])]) for r in mine if (seq, baseline, r["round"]) in by]
        if variant != baseline and pairs:
            row["speed_x_baseline"] = spread([b["step_s"] / r["step_s"] for r, b in pairs])
            peak_pairs = [(r, b) for r, b in pairs if r["peak_allocated_GB"] and b["peak_allocated_GB"]]
            if peak_pairs:
                row["peak_x_baseline"] = spread([r["peak_allocated_GB"] / b["peak_allocated_GB"] for r, b in peak_pairs])
        rows.append(row)
    return rows


def as_text(s: dict) -> str:
    text = f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"
    return ("equal: " + text) if round(s["min"], 3) <= 1.0 <= round(s["max"], 3) else text


def markdown(result: dict) -> str:
    lines = [f"# {result['rounds']} interleaved rounds, one process per variant", "",
             f"command: `{result['command']}`", "",
             f"| seq | variant | rounds | step s median (min-max) | peak alloc GB (largest) | speed x {result['baseline']} "
             f"| peak x {result['baseline']} |", "|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        step = r["step_s"]
        peak = f"{r['peak_allocated_GB']:.2f}" if "peak_allocated_GB" in r else "-"
        lines.append(f"| {r['seq']} | {r['variant']} | {r['rounds']} | {step['median']:.3f} ({step['min']:.3f}-"
                     f"{step['max']:.3f}) | {peak} | {as_text(r['speed_x_baseline']) if 'speed_x_baseline' in r else '-'}"
                     f" | {as_text(r['peak_x_baseline']) if 'peak_x_baseline' in r else '-'} |")
    if result["failed"]:
        lines += ["", "Failed: " + "; ".join(result["failed"])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", required=True, help="the variant every ratio is taken against")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--resume", action="store_true",
                   help="keep the rounds of --out/rounds.json that every variant finished, run the rest")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark's command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    variants, rest, option = variants_of(command)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected 1 or more")
    if args.baseline not in variants:
        p.error(f"--baseline {args.baseline!r} is not among the wrapped command's variants {','.join(variants)}")
    result = {"command": shlex.join(["python3", "benchmarks/rounds.py", "--rounds", str(args.rounds), "--baseline",
                                     args.baseline, "--out", "OUTDIR", "--", *command]),
              "rounds": args.rounds, "order": ORDER, "baseline": args.baseline, "runs": [], "failed": []}
    done = set()
    if args.resume:
        result["runs"], result["failed"], done = earlier_rounds(args.out, command, variants, args.rounds)
        result["rounds_kept_from_earlier"] = sorted(done)  # measured in an earlier sitting
        print(f"resuming: rounds {sorted(done)} kept", flush=True)
    text = write(result, args.out) if done else ""
    for round_number, variant in orders(variants, args.rounds):
        if round_number in done:
            continue
        out = args.out / f"round{round_number}" / variant
        out.mkdir(parents=True, exist_ok=True)
        run = subprocess.run(run_command(rest, option, variant, out), text=True, capture_output=True)
        (out / "log.txt").write_text(run.stdout + run.stderr)
        written = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
        # The package's bench runs just the variant given, named as it canonicalises it ("true" is "all").
        # Each run keeps the script's own row and the rest of its JSON (bytes moved, waits, the
        # bandwidth it measured): what bounds a figure is read from them, not measured again.
        got = [dict(seq=r.get("seq"), variant=variant, round=round_number, **measured(r), row=r,
                    script_output={k: v for k, v in data.items() if k != "runs"})
               for data in written for r in data.get("runs", []) if r.get("variant") == variant or option == "--modes"]
        if run.returncode != 0 or not any("step_s" in g for g in got):
            result["failed"].append(f"round {round_number} {variant}: exit {run.returncode}, "
                                    + (run.stderr.strip().splitlines() or ["no output"])[-1][:200])
        result["runs"] += got
        print(f"round {round_number} {variant}: " + ", ".join(
            f"{g['seq']}: {g['step_s']:.3f} s" for g in got if "step_s" in g), flush=True)
        text = write(result, args.out)  # after every run: a run stopped by a time limit keeps the rounds done
    print(text)
    return 1 if result["failed"] else 0


def write(result: dict, out: Path) -> str:
    """Summarises the runs so far into out/rounds.json and out/rounds.md; returns the table. The
    GPU, host CPU, torch and dates are the runs' own, as their scripts wrote them."""
    outputs = [r["script_output"] for r in result["runs"] if "script_output" in r]
    for key in ("gpu", "host_cpu", "torch"):
        values = sorted({str(o[key]) for o in outputs if o.get(key)})
        if values:
            result[key] = values[0] if len(values) == 1 else values
    dates = sorted(str(o["date"])[:10] for o in outputs if o.get("date"))
    if dates:
        result["date"] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    result["summary"] = summarise(result["runs"], result["baseline"])
    (out / "rounds.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (out / "rounds.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
