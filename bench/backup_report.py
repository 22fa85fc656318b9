#!/usr/bin/env python3
"""Tables and JSON for bench/backup.sh: reads its records (one JSON object a line), prints per
dataset the bytes each tool added to its repository per snapshot beside the zstd --patch-from
oracle, the totals of versions 2..N and the ratios, then the speed and memory of every run and
the goals of the issue. Writes everything (records included) to OUT.

    bench/backup_report.py RECORDS.jsonl OUT.json --command CMD --seconds S [--versions JSON]
"""
import argparse
import datetime
import json
import sys

TOOLS = ["dedupwire", "restic", "borg"]
TITLES = {
    "rel-django": "release series: Django sdists unpacked in turn to one path",
    "rel-sqlalchemy": "release series: SQLAlchemy sdists unpacked in turn to one path",
    "dumps": "nightly pg_dumps of a document table to one file, 1% of rows edited a night",
    "tree": "a large tree (copy of /usr): first backup, nothing changed, 1% of files touched",
}


def mb(b):
    return "-" if b is None else f"{b / 1e6:.3f}"


def ratio(a, b):
    return None if a is None or not b else a / b


def fx(r, digits=3):
    return "-" if r is None else f"{r:.{digits}f}x"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("out")
    ap.add_argument("--command", default="")
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--versions", default="{}")
    ap.add_argument("--nproc", default="")
    ap.add_argument("--env", default="")
    a = ap.parse_args()
    recs = [json.loads(line) for line in open(a.records) if line.strip()]
    tools = [t for t in TOOLS if any(r.get("tool") == t for r in recs)]
    datasets = []
    for r in recs:
        if r.get("dataset") and r["dataset"] not in datasets and r["kind"] in ("backup", "oracle"):
            datasets.append(r["dataset"])

    summary = {"datasets": {}, "speed": [], "goals": [], "failures": []}
    for r in recs:
        if r["kind"] in ("backup", "restore") and r.get("rc", 0) != 0:
            summary["failures"].append({k: r.get(k) for k in ("dataset", "tool", "label", "rc", "command", "stderr")})
        if r["kind"] == "restore" and r.get("verified") != "yes":
            summary["failures"].append({k: r.get(k) for k in ("dataset", "tool", "label", "rc", "command", "diff")})

    # --- growth per snapshot ---------------------------------------------------------------
    for ds in datasets:
        inputs = {r["index"]: r for r in recs if r["kind"] == "input" and r["dataset"] == ds}
        ora = {r["index"]: r for r in recs if r["kind"] == "oracle" and r["dataset"] == ds}
        back = {(r["tool"], r["index"]): r for r in recs if r["kind"] == "backup" and r["dataset"] == ds}
        idx = sorted({i for (_, i) in back} | set(ora))
        cols = tools + (["oracle"] if ora else [])
        print(f"\n### {ds}: {TITLES.get(ds, ds)}")
        print("bytes added to the repository per snapshot (du -sb after - before), MB")
        head = f"{'#':>3} {'snapshot':<18} {'input MB':>10} " + "".join(f"{c:>12}" for c in cols)
        print(head)
        print("-" * len(head))
        per = {c: {} for c in cols}
        for i in idx:
            label = (back.get((tools[0], i)) or ora.get(i) or inputs.get(i) or {}).get("label", str(i))
            ib = (inputs.get(i) or inputs.get(1) or {}).get("bytes") if ds != "tree" else inputs.get(1, {}).get("bytes")
            row = f"{i:>3} {label:<18} {mb(ib):>10} "
            for c in cols:
                r = ora.get(i) if c == "oracle" else back.get((c, i))
                v = None if r is None else r.get("added")
                if r is not None and c != "oracle" and r.get("rc", 0) != 0:
                    row += f"{'ERR ' + mb(v):>12}"
                else:
                    row += f"{mb(v):>12}"
                per[c][i] = v
            print(row)
        tot = {c: sum(v for i, v in per[c].items() if i >= 2 and v is not None) if len(idx) > 1 else None
               for c in cols}
        first = {c: per[c].get(1) for c in cols}
        print("-" * len(head))
        print(f"{'':>3} {'total 2..' + str(idx[-1]):<18} {'':>10} " + "".join(f"{mb(tot[c]):>12}" for c in cols))
        print(f"{'':>3} {'all':<18} {'':>10} "
              + "".join(f"{mb(sum(v for v in per[c].values() if v is not None)):>12}" for c in cols))
        if ora:
            ms = sorted({r["method"] for r in ora.values()}, key=lambda m: "patch" in m)
            print("oracle: " + "; ".join(ms))
        d = {"title": TITLES.get(ds, ds), "added": {c: per[c] for c in cols}, "total_2_to_n": tot,
             "first": first, "inputs": inputs}
        if "dedupwire" in tools and len(idx) > 1:
            parts = []
            for other in [t for t in tools if t != "dedupwire"] + (["oracle"] if ora else []):
                q = ratio(tot["dedupwire"], tot.get(other))
                d[f"ratio_2_to_n_dedupwire_over_{other}"] = q
                parts.append(f"dedupwire/{other} = {fx(q)}")
            q1 = {o: ratio(first["dedupwire"], first.get(o)) for o in tools if o != "dedupwire"}
            print("versions 2.." + str(idx[-1]) + ": " + ", ".join(parts)
                  + "   (first version: " + ", ".join(f"dedupwire/{o} = {fx(v)}" for o, v in q1.items()) + ")")
        summary["datasets"][ds] = d

    # --- speed ------------------------------------------------------------------------------
    print("\n### speed and memory (wall and CPU seconds, peak RSS MB; ratios dedupwire/restic)")
    head = (f"{'dataset':<15}{'run':<18}{'tool':<10}{'MB':>9}{'wall s':>9}{'cpu s':>9}{'MB/s':>8}"
            f"{'RSS MB':>8}{'wall/restic':>12}{'rss/restic':>11}")
    print(head)
    print("-" * len(head))
    groups = {}
    for r in recs:
        if r["kind"] in ("backup", "restore"):
            run = r["run"]
            # Release series and dumps: version 1, then the later versions summed.
            if r["dataset"] != "tree" and r["kind"] == "backup":
                run = "v1" if r.get("index") == 1 else "v2..N"
            groups.setdefault((r["dataset"], run), {}).setdefault(r["tool"], []).append(r)
    order = []
    for ds in datasets:
        runs = [k for k in groups if k[0] == ds]
        runs.sort(key=lambda k: (k[1] == "restore", min(x.get("index", 99) for v in groups[k].values() for x in v)))
        order += runs
    for key in order:
        ds, run = key
        g = groups[key]
        agg = {}
        for t in tools:
            rs = g.get(t, [])
            if not rs:
                continue
            inb = None
            if run == "restore":
                inb = rs[0].get("bytes")
            else:
                ins = [r for r in recs if r["kind"] == "input" and r["dataset"] == ds]
                src = {x["index"]: x["bytes"] for x in ins}
                inb = sum(src.get(r.get("index"), src.get(1, 0)) for r in rs)
            agg[t] = {"wall": sum(r["wall"] for r in rs), "cpu": sum(r["user"] + r["sys"] for r in rs),
                      "rss_kb": max(r["rss_kb"] for r in rs), "bytes": inb, "n": len(rs),
                      "rc": max(r.get("rc", 0) for r in rs),
                      "verified": all(r.get("verified", "yes") == "yes" for r in rs)}
        for t, v in agg.items():
            rw = ratio(v["wall"], agg.get("restic", {}).get("wall")) if t == "dedupwire" else None
            rr = ratio(v["rss_kb"], agg.get("restic", {}).get("rss_kb")) if t == "dedupwire" else None
            flag = "" if v["rc"] == 0 else f"  EXIT {v['rc']}"
            if not v["verified"]:
                flag += "  RESTORE DIFFERS"
            label = run if v["n"] == 1 else f"{run} (sum of {v['n']})"
            mbs = v["bytes"] / 1e6 / v["wall"] if v["bytes"] and v["wall"] else None
            print(f"{ds:<15}{label:<18}{t:<10}{(v['bytes'] or 0) / 1e6:>9.0f}{v['wall']:>9.2f}{v['cpu']:>9.2f}"
                  f"{(mbs or 0):>8.1f}{v['rss_kb'] / 1024:>8.0f}{fx(rw, 2):>12}{fx(rr, 2):>11}{flag}")
            summary["speed"].append({"dataset": ds, "run": run, "tool": t, **v, "mb_per_s": mbs,
                                     "wall_over_restic": rw, "rss_over_restic": rr})

    # --- goals --------------------------------------------------------------------------------
    def sp(ds, run, t):
        for s in summary["speed"]:
            if s["dataset"] == ds and s["run"] == run and s["tool"] == t:
                return s
        return None

    goals = []
    D = summary["datasets"]
    rel = [ds for ds in D if ds.startswith("rel-")]
    for ds in rel:
        goals.append((f"{ds}: growth after v1 vs borg", D[ds].get("ratio_2_to_n_dedupwire_over_borg"), 0.45))
    if len(rel) > 1:
        goals.append(("release series (both): growth after v1 vs borg",
                      ratio(sum(D[d]["total_2_to_n"]["dedupwire"] for d in rel),
                            sum(D[d]["total_2_to_n"].get("borg") or 0 for d in rel)), 0.45))
    if "dumps" in D:
        goals.append(("dumps: growth after dump 1 vs restic", D["dumps"].get("ratio_2_to_n_dedupwire_over_restic"), 0.05))
    for run in ("first", "incr-unchanged", "incr-touched"):
        s = sp("tree", run, "dedupwire")
        if s:
            goals.append((f"tree {run}: backup wall vs restic", s["wall_over_restic"], 0.67))
    # The later versions of the release series and the dumps are incremental runs too.
    for ds in D:
        if ds == "tree":
            continue
        w = {t: sum(r["wall"] for r in recs if r["kind"] == "backup" and r["dataset"] == ds
                    and r["tool"] == t and r["index"] >= 2) for t in ("dedupwire", "restic")}
        if w["restic"]:
            goals.append((f"{ds} v2..N (incremental): backup wall vs restic", ratio(w["dedupwire"], w["restic"]), 0.67))
    for ds in ("dumps", "tree"):
        s = sp(ds, "restore", "dedupwire")
        if s:
            goals.append((f"{ds}: restore wall vs restic", s["wall_over_restic"], 1.0))
    bk = [s for s in summary["speed"] if s["run"] != "restore"]
    rs = [s for s in summary["speed"] if s["run"] == "restore"]
    for name, group in (("backup", bk), ("restore", rs)):
        dwm = max((s["rss_kb"] for s in group if s["tool"] == "dedupwire"), default=None)
        rsm = max((s["rss_kb"] for s in group if s["tool"] == "restic"), default=None)
        goals.append((f"peak RSS over all {name} runs vs restic", ratio(dwm, rsm), 1.0))
    for key in order:
        s = sp(key[0], key[1], "dedupwire")
        if s and s["rss_over_restic"] is not None:
            goals.append((f"  peak RSS {key[0]} {key[1]}", s["rss_over_restic"], 1.0))
    print("\n### goals (dedupwire / peer, in this run)")
    for name, v, lim in goals:
        holds = None if v is None else v <= lim
        print(f"{name:<60}{fx(v):>10}   target <= {lim:<5} {'-' if holds is None else ('holds' if holds else 'MISSED')}")
        summary["goals"].append({"goal": name, "value": v, "target": lim, "holds": holds})
    if summary["failures"]:
        print("\n### failures")
        for f in summary["failures"]:
            print(json.dumps(f)[:2000])

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": a.command, "settings": a.env, "seconds": a.seconds, "nproc": a.nproc,
           "versions": json.loads(a.versions), "summary": summary, "records": recs}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nraw figures: {a.out}")
    print(f"command: {a.command}")
    print(f"benchmark wall time: {a.seconds / 60:.1f} min")


if __name__ == "__main__":
    sys.exit(main())
