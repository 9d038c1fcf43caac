"""The markdown report of a benchmark run (from the results dict that bench.py writes as JSON)."""

from __future__ import annotations

from typing import Any


def fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def figures(name: str, r: dict[str, Any], peak: float | None) -> dict[str, float | None]:
    """The table's numbers for one system."""
    train, decode = r.get("train", {}), r.get("decode", {})
    identical = train.get("identical", {}).get("tgt_tokens_per_s")
    bucketed = train.get("bucketed", {}).get("tgt_tokens_per_s")
    n = train.get("params", {}).get("non_embedding")

    def mfu(tok_s: float | None) -> float | None:
        return 100 * 6 * n * tok_s / 1e9 / peak if tok_s and n and peak else None

    return {
        "identical": identical,
        "mfu": mfu(identical),
        "bucketed": bucketed,
        "mfu_bucketed": mfu(bucketed),
        "greedy": decode.get("greedy", {}).get("sentences_per_s"),
        "beam": decode.get("beam", {}).get("sentences_per_s"),
        # host RSS, or on a GPU the memory torch allocated there
        "rss_train": train.get("peak_device_mb", train.get("peak_rss_mb")),
        "rss_greedy": decode.get("peak_device_mb_greedy", decode.get("peak_rss_mb_greedy")),
        # the process ran greedy first: its peak after beam search is the beam search's
        "rss_beam": decode.get("peak_device_mb", decode.get("peak_rss_mb"))
        if "beam" in decode
        else None,
        "non_embedding": n,
        "train_contended": train.get("contended"),
        "decode_contended": decode.get("contended"),
    }


def table(results: dict[str, Any]) -> list[str]:
    peak = results["peak"].get("peak_gflops")
    rows = {name: figures(name, r, peak) for name, r in results["systems"].items()}
    k = results["args"]["beam"]
    memory_kind = "device memory" if results["args"].get("device") == "cuda" else "RSS"
    lines = [
        f"| system | non-emb params | train tok/s, identical batches | MFU | "
        f"train tok/s, qkv bucketed batches (MFU) | greedy sent/s | beam-{k} sent/s | "
        f"peak {memory_kind} MB train / greedy / beam-{k} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in rows.items():
        train_mark = " †" if f["train_contended"] else ""
        decode_mark = " †" if f["decode_contended"] else ""
        bucketed = f"{fmt(f['bucketed'])} ({fmt(f['mfu_bucketed'], 1)} %)" if f["bucketed"] else "—"
        mfu = f"{fmt(f['mfu'], 1)} %" if f["mfu"] else "—"
        lines.append(
            f"| {name} | {fmt(f['non_embedding'])} | {fmt(f['identical'])}{train_mark} | {mfu} | "
            f"{bucketed} | {fmt(f['greedy'], 1)}{decode_mark} | {fmt(f['beam'], 1)}{decode_mark} | "
            f"{fmt(f['rss_train'])} / {fmt(f['rss_greedy'])} / {fmt(f['rss_beam'])} |"
        )
    peers = [n for n in rows if n != "qkv"]
    if "qkv" in rows and peers:
        q = rows["qkv"]

        def top(key: str) -> tuple[str, float | None]:
            values = {p: rows[p][key] for p in peers if rows[p][key]}
            if not values:
                return "", None
            name = max(values, key=lambda p: values[p] or 0.0)
            return name, values[name]

        cells = []
        for key in ("identical", "mfu", "bucketed", "greedy", "beam"):
            name, value = top("identical" if key == "bucketed" else key)
            cells.append(f"{ratio(q[key], value)} ({name})" if value else "—")
        memory = []
        for key in ("rss_train", "rss_greedy", "rss_beam"):
            values = [rows[p][key] for p in peers if rows[p][key]]
            memory.append(ratio(q[key], min(values)) if values else "—")
        lines.append(
            f"| **qkv / best peer** | | {' | '.join(cells)} | {' / '.join(memory)} (lowest) |"
        )
    if any(f["train_contended"] or f["decode_contended"] for f in rows.values()):
        lines += [
            "",
            "† measured while another process held a core (the phase's matmul probe "
            "stayed under 0.75 × the best one, re-runs included): depressed; see the "
            "interleaved pairs.",
        ]
    return lines


def rounds(results: dict[str, Any]) -> list[str]:
    """Each round's decoding speeds, and qkv's ratio to each peer round by round."""
    decoded = {n: r["decode"] for n, r in results["systems"].items() if "greedy" in r["decode"]}
    if "qkv" not in decoded or len(decoded["qkv"]["greedy"].get("rounds", [])) < 2:
        return []
    lines = ["", "### Decoding, round by round (sentences/s; qkv / peer)", ""]
    for kind in ("greedy", "beam"):
        own = decoded["qkv"].get(kind, {}).get("rounds")
        if not own:
            continue
        cells = []
        for name, d in decoded.items():
            speeds = d.get(kind, {}).get("rounds")
            if not speeds:
                continue
            text = f"{name} " + ", ".join(fmt(x, 1) for x in speeds)
            if name != "qkv":
                ratios = (ratio(a, b) for a, b in zip(own, speeds, strict=True))
                text += " (" + ", ".join(ratios) + ")"
            cells.append(text)
        lines.append(f"- {kind}: " + "; ".join(cells) + ".")
    return lines


def pairs(results: dict[str, Any]) -> list[str]:
    if not results.get("pairs"):
        return []
    peak = results["peak"].get("peak_gflops")
    n = results["systems"].get("qkv", {}).get("train", {}).get("params", {}).get("non_embedding")
    lines = [
        "",
        "### Interleaved in one process (qkv = A)",
        "",
        "| part | peer (B) | A | B | A / B |",
        "|---|---|---:|---:|---:|",
    ]
    for p in results["pairs"]:
        if "error" in p:
            lines.append(f"| {p.get('pair_part', '?')} | {p.get('peer', '?')} | failed | | |")
            continue
        if "train" in p:
            t = p["train"]
            lines.append(
                f"| train tok/s | {p['b']} | {fmt(t['a_tokens_per_s'])} | "
                f"{fmt(t['b_tokens_per_s'])} | {t['ratio']:.2f}× (median pair "
                f"{t['ratio_median_pair']:.2f}×) |"
            )
            if peak and n:
                mfu = 100 * 6 * n * t["a_tokens_per_s"] / 1e9 / peak
                lines.append(
                    f"| qkv MFU, interleaved | | {mfu:.1f} % | | {host_speed(results, p)} |"
                )
        for kind, d in p.get("decode", {}).items():
            lines.append(
                f"| {kind} sent/s | {p['b']} | {fmt(d['a_sentences_per_s'], 1)} | "
                f"{fmt(d['b_sentences_per_s'], 1)} | {d['ratio']:.2f}× |"
            )
    return lines


def host_speed(results: dict[str, Any], pair: dict[str, Any]) -> str:
    """The pair phase's matmul probes beside those of qkv's own training phase: the MFU is
    against the peak of the peak phase, and a slower stretch of the host lowers it."""
    own = results["systems"].get("qkv", {}).get("train", {}).get("probe_gflops") or []
    here = pair.get("probe_gflops") or []
    if not own or not here:
        return ""
    return (
        f"probes {min(here):.0f}–{max(here):.0f} GFLOP/s "
        f"(qkv's training phase: {min(own):.0f}–{max(own):.0f})"
    )


def workers(results: dict[str, Any]) -> list[str]:
    """Decoding one batch at a time on N threads against N worker threads of one thread."""
    w = results.get("workers")
    if not w or "error" in w:
        return ["", "Decoding in worker threads: failed (see the JSON)."] if w else []
    kinds = [k for k in ("greedy", "beam") if k in w]
    peer, n = w["peer"], w["workers"]
    lines = [
        "",
        f"### Decoding {n} batches at once, in worker threads of one thread (`--workers {n}`), "
        "interleaved",
        "",
        f"Both systems through qkv's `map_in_workers`; a pass decodes all {w['sentences']} "
        "sentences. 1 × N: one batch at a time on N threads (as the peer ships); N × 1: qkv's "
        "default. Ratios are against the peer one batch at a time and against the peer split "
        "the same way.",
        "",
        "| system | workers × threads | "
        + " | ".join(f"{k} sent/s | ×{peer} | ×{peer} split" for k in kinds)
        + " |",
        "|---|---|" + "---:|---:|---:|" * len(kinds),
    ]
    for index, row in enumerate(w[kinds[0]]):
        cells = []
        for kind in kinds:
            rows = {(r["system"], r["workers"]): r["sentences_per_s"] for r in w[kind]}
            value = w[kind][index]["sentences_per_s"]
            cells += [fmt(value, 1), ratio(value, rows[(peer, 1)]), ratio(value, rows[(peer, n)])]
        lines.append(
            f"| {row['system']} | {row['workers']} × {row['threads_each']} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def profile(results: dict[str, Any]) -> list[str]:
    p = results.get("profile")
    if not p or "error" in p:
        return []
    split = p["split_ms"]
    lines = [
        "",
        "### Where a qkv training step goes (separate process, identical batches)",
        "",
        f"Wall clock per step over {p['steps']} steps: forward + loss "
        f"{split['forward_loss']:.0f} ms, backward {split['backward']:.0f} ms, optimizer "
        f"{split['optimizer']:.0f} ms. torch.profiler self-CPU time of one step:",
        "",
        "| category | % |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in p["category_pct"].items()]
    lines += [
        "",
        "Top ops (self ms, calls): "
        + "; ".join(f"{o['op']} {o['self_ms']:.0f} ({o['calls']})" for o in p["top_ops"][:8]),
    ]
    return lines + decode_split(p.get("decode_split", {}))


def decode_split(split: dict[str, Any]) -> list[str]:
    """Milliseconds per decoding step by part (indented parts are inside the part above)."""
    if not split:
        return []
    kinds = list(split)
    parts = list(dict.fromkeys(part for kind in kinds for part in split[kind]["parts_ms"]))
    lines = [
        "",
        "### Where a qkv decoding step goes (wall clock, ms per step)",
        "",
        f"| part | {' | '.join(kinds)} |",
        "|---|" + "---:|" * len(kinds),
        f"| **whole step** | {' | '.join(fmt(split[k]['step_ms'], 2) for k in kinds)} |",
    ]
    for part in parts:
        cells = [split[k]["parts_ms"].get(part) for k in kinds]
        depth = (len(part) - len(part.lstrip(" "))) // 2
        name = "&nbsp;&nbsp;" * depth + ("↳ " if depth else "") + part.strip()
        lines.append(f"| {name} | {' | '.join(fmt(c, 2) for c in cells)} |")
    return lines


def load_lines(results: dict[str, Any]) -> list[str]:
    def describe(load: dict[str, float]) -> str:
        if not load:
            return "unknown"
        return f"load average {load['loadavg_1m']:.2f}, CPUs {100 * load['busy']:.0f} % busy"

    phases = [
        results["peak"],
        *(r[k] for r in results["systems"].values() for k in ("train", "decode")),
        *results.get("pairs", []),
        *([results["workers"]] if "workers" in results else []),
    ]
    busy = [r["load_before"]["busy"] for r in phases if r.get("load_before")]
    probes = [x for r in phases for x in r.get("probe_gflops", [])]
    lines = [
        f"Load: at start {describe(results['load_start'])}; at end {describe(results['load_end'])}."
    ]
    waited = sum(r.get("waited_for_quiet_s", 0.0) for r in phases)
    reruns = sum(len(r.get("contended_runs", [])) for r in phases)
    if waited or reruns:
        lines.append(
            f"Waited {waited:.0f} s in all for other processes to go idle; re-ran "
            f"{reruns} contended phase(s)."
        )
    if busy:
        lines[0] += (
            f" Other processes kept {100 * min(busy):.0f}–{100 * max(busy):.0f} % of "
            "the CPUs busy just before the phases."
        )
    if probes:
        lines.append(
            f"1024³ matmul probe during the phases: {min(probes):.0f}–"
            f"{max(probes):.0f} GFLOP/s (a low value means a core was taken)."
        )
    return lines


def peak_sentence(results: dict[str, Any]) -> str:
    """The matmul peak, and where oneDNN's was measured too, torch.mm's alone beside it."""
    r, dtype = results["peak"], results["args"].get("dtype", "fp32")
    if not r.get("onednn_gflops"):
        peak = fmt(r.get("peak_gflops"), 1)
        return f"Matmul peak ({dtype}, best square torch.mm): **{peak} GFLOP/s**."
    mm = r["torch_mm_peak_gflops"]
    return (
        f"Matmul peak ({dtype}, best square product of torch.mm and of oneDNN's matmul): "
        f"**{fmt(r['peak_gflops'], 1)} GFLOP/s** (oneDNN {fmt(max(r['onednn_gflops'].values()), 1)}"
        f", torch.mm {fmt(mm, 1)}: the peak of the reference protocol, `peers.py`; an MFU "
        f"against it is {r['peak_gflops'] / mm:.2f}× the one given here)."
    )


def render(results: dict[str, Any]) -> str:
    a, v = results["args"], results["versions"]
    lines = [
        "# qkv speed benchmark",
        "",
        f"{results['generated']}; {v['cpu']}; {a['threads']} torch threads; torch {v['torch']}, "
        f"transformers {v['transformers']}, x-transformers {v['x-transformers']}. "
        f"Total wall {results['total_wall_s']:.0f} s.",
        "",
        f"`{results['command']}`",
        "",
        *load_lines(results),
        "",
        f"Device {a.get('device', 'cpu')}, {a.get('dtype', 'fp32')}"
        + (
            " (training under torch.autocast, decoding with every weight cast to bf16)"
            if a.get("dtype") == "bf16"
            else ""
        )
        + f". {peak_sentence(results)} "
        "MFU = 6 × non-embedding parameters × non-pad target tokens/s / peak.",
        "",
        (
            "Training: not measured (`--no-train`). "
            if a.get("no_train")
            else f"Training: {a['warmup']} warm-up + {a['steps']} timed steps of "
            f"≥{a['batch_tokens']} target tokens, median of {a['repeats']} passes; "
            "label smoothing 0.1. "
        )
        + (
            "Decoding: not measured (`--no-decode`)."
            if a.get("no_decode")
            else f"Decoding: {a['sentences']} sentences, batch {a['infer_batch']}, exactly "
            f"{a['new_tokens']} new tokens, median of every pass of "
            f"{a.get('decode_rounds', 1)} round(s) (each system's phase once a round, in a "
            "fresh process, the systems taking turns)."
        )
        + (
            " On the GPU every timed batch first runs once untimed (a new shape's first step"
            " costs about 0.4 s there, once per process)."
            if a.get("device") == "cuda"
            else ""
        ),
        "",
        *table(results),
        *rounds(results),
        *pairs(results),
        *workers(results),
        *profile(results),
    ]
    if results.get("skipped_peers"):
        lines += ["", "Not installed, skipped: " + ", ".join(results["skipped_peers"]) + "."]
    failed = [
        f"{n} {k}"
        for n, r in results["systems"].items()
        for k in ("train", "decode")
        if "error" in r[k]
    ]
    if failed:
        lines += ["", "Failed phases: " + ", ".join(failed) + " (see the JSON)."]
    return "\n".join(lines) + "\n"
