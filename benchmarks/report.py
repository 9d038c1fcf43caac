"""The markdown report of a benchmark run (from the results dict that bench.py writes as JSON)."""

from __future__ import annotations

from typing import Any

QKV = "qkv"


def fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def way_speed(decode: dict[str, Any], kind: str, way: str) -> float | None:
    return decode.get(kind, {}).get("ways", {}).get(way, {}).get("sentences_per_s")


def figures(r: dict[str, Any], peak: float | None) -> dict[str, Any]:
    """The tables' numbers for one system."""
    train, decode = r.get("train", {}), r.get("decode", {})
    identical = train.get("identical", {}).get("tgt_tokens_per_s")
    bucketed = train.get("bucketed", {}).get("tgt_tokens_per_s")
    n = train.get("params", {}).get("non_embedding")

    def mfu(tok_s: float | None) -> float | None:
        return 100 * 6 * n * tok_s / 1e9 / peak if tok_s and n and peak else None

    shipped = {
        kind: way_speed(decode, kind, "shipped") or way_speed(decode, kind, "one")
        for kind in ("greedy", "beam")
    }
    return {
        "identical": identical,
        "mfu": mfu(identical),
        "bucketed": bucketed,
        "mfu_bucketed": mfu(bucketed),
        "bucketed_padding": train.get("bucketed", {}).get("padding"),
        "greedy": decode.get("greedy", {}).get("sentences_per_s"),
        "beam": decode.get("beam", {}).get("sentences_per_s"),
        "greedy_one": way_speed(decode, "greedy", "one"),
        "greedy_shipped": shipped["greedy"],
        "beam_shipped": shipped["beam"],
        "own_batching": "shipped" in decode.get("greedy", {}).get("ways", {}),
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


def split_workers(results: dict[str, Any]) -> int:
    """How many greedy batches each system decoded at once in the headline (1: one at a time)."""
    for r in results["systems"].values():
        split = r.get("decode", {}).get("greedy", {}).get("ways", {}).get("split")
        if split:
            return int(split["workers"])
    return 1


def qkv_systems(results: dict[str, Any]) -> list[str]:
    return [QKV, *results.get("baselines", [])]


def peers_of(results: dict[str, Any]) -> list[str]:
    return [n for n in results["systems"] if n not in qkv_systems(results)]


def ratio_rows(
    results: dict[str, Any],
    rows: dict[str, dict[str, Any]],
    speeds: list[str],
    memory: list[str],
    blank: int,
) -> list[str]:
    """qkv over the best peer (highest speed, lowest memory), then qkv over each baseline
    (new / old) and over each decode-only peer, figure by figure; `blank` empty cells after the
    name. A decode-only peer has no training figures: the best peer of those is a trainable one."""
    if QKV not in rows:
        return []
    q, lines = rows[QKV], []
    peers = [p for p in peers_of(results) if p in rows]

    def row(name: str, cells: list[str]) -> str:
        return f"| {name} |" + " |" * blank + " " + " | ".join(cells) + " |"

    if peers:
        cells = []
        for key in speeds:
            values = {p: rows[p][key] for p in peers if rows[p][key]}
            name = max(values, key=lambda p: values[p]) if values else None
            cells.append(f"{ratio(q[key], values[name])} ({name})" if name else "—")
        if memory:
            lowest = []
            for key in memory:
                values = [rows[p][key] for p in peers if rows[p][key]]
                lowest.append(ratio(q[key], min(values)) if values else "—")
            cells.append(" / ".join(lowest) + " (lowest)")
        lines.append(row("**qkv / best peer**", cells))
    others = [(old, f"**qkv / {old}** (new / old)") for old in results.get("baselines", [])]
    others += [(peer, f"**qkv / {peer}**") for peer in results.get("decode_only", [])]
    for other, label in others:
        if other not in rows:
            continue
        o = rows[other]
        cells = [ratio(q[key], o[key]) for key in speeds]
        if memory:
            cells.append(" / ".join(ratio(q[key], o[key]) for key in memory))
        lines.append(row(label, cells))
    return lines


def headline(results: dict[str, Any]) -> list[str]:
    """Like for like: identical training batches, the same greedy batches in flight."""
    peak = results["peak"].get("peak_gflops")
    rows = {name: figures(r, peak) for name, r in results["systems"].items()}
    k = results["args"]["beam"]
    n = split_workers(results)
    greedy = f"greedy sent/s, {n} batches at once" if n > 1 else "greedy sent/s"
    memory_kind = "device memory" if results["args"].get("device") == "cuda" else "RSS"
    lines = [
        "## Like for like",
        "",
        f"| system | non-emb params | train tok/s, identical batches | MFU | {greedy} | "
        f"beam-{k} sent/s | peak {memory_kind} MB train / greedy / beam-{k} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    decode_only = results.get("decode_only", [])
    for name, f in rows.items():
        train_mark = " †" if f["train_contended"] else ""
        decode_mark = " †" if f["decode_contended"] else ""
        mfu = f"{fmt(f['mfu'], 1)} %" if f["mfu"] else "—"
        train = "decode only" if name in decode_only else f"{fmt(f['identical'])}{train_mark}"
        lines.append(
            f"| {name} | {fmt(f['non_embedding'])} | {train} | {mfu} | "
            f"{fmt(f['greedy'], 1)}{decode_mark} | {fmt(f['beam'], 1)}{decode_mark} | "
            f"{fmt(f['rss_train'])} / {fmt(f['rss_greedy'])} / {fmt(f['rss_beam'])} |"
        )
    lines += ratio_rows(
        results,
        rows,
        ["identical", "mfu", "greedy", "beam"],
        ["rss_train", "rss_greedy", "rss_beam"],
        1,
    )
    lines += engines(results)
    if any(f["train_contended"] or f["decode_contended"] for f in rows.values()):
        lines += [
            "",
            "† measured while another process held a core (the phase's matmul probe "
            "stayed under 0.75 × the best one, re-runs included): depressed; see the "
            "interleaved pairs.",
        ]
    return lines


def engines(results: dict[str, Any]) -> list[str]:
    """What the decode-only peers (CTranslate2) are, and which translator took each way."""
    found = [p for p in results.get("decode_only", []) if p in results["systems"]]
    if not found:
        return []
    layouts: dict[str, list[str]] = {}
    for name in found:
        meta = results["systems"][name].get("decode", {}).get("meta", {})
        if meta.get("threads"):
            layouts.setdefault(meta["threads"], []).append(name)
    described = "; ".join(
        layout if len(names) == len(found) else f"{', '.join(names)}: {layout}"
        for layout, names in layouts.items()
    )
    return [
        "",
        f"{', '.join(found)}: CTranslate2, decoding only (no training phase): qkv's model of "
        "this shape converted by qkv's exporter (as `qkv export`), float32 or int8 weights, "
        "decoding the same batches to exactly as many new tokens. Each way has a translator of "
        "its own: a batch in a worker thread of the split goes to one of a replica per worker "
        "thread, a batch one at a time to one replica on all the threads"
        + (f" ({described})" if described else "")
        + ". Their peak RSS includes the torch model they were exported from, the export "
        "and both translators. The best peer's training figures are those of the trainable "
        "peers.",
    ]


def as_shipped(results: dict[str, Any]) -> list[str]:
    """Each system as it ships: decoding one batch at a time (the peers) or as qkv translate
    batches; training on qkv's own length-bucketed batches (qkv only)."""
    peak = results["peak"].get("peak_gflops")
    rows = {name: figures(r, peak) for name, r in results["systems"].items()}
    if not any(f["greedy_one"] or f["bucketed"] for f in rows.values()):
        return []
    k, threads = results["args"]["beam"], results["args"]["threads"]
    lines = [
        "",
        "## As shipped (beside the like-for-like figures, not instead of them)",
        "",
        f"Greedy one batch at a time on {threads} threads: how every peer decodes. As shipped: "
        "the peers one batch at a time; qkv as `qkv translate` batches (its qkv side's "
        "`map_batches`). Training on qkv's own batching: the same sentence pairs regrouped by "
        "length (qkv's trainer's default), for qkv only; no peer is given it.",
        "",
        f"| system | greedy sent/s, one batch at a time | greedy sent/s, as shipped | "
        f"beam-{k} sent/s, as shipped | train tok/s, qkv's bucketed batches (MFU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, f in rows.items():
        bucketed = f"{fmt(f['bucketed'])} ({fmt(f['mfu_bucketed'], 1)} %)" if f["bucketed"] else "—"
        lines.append(
            f"| {name} | {fmt(f['greedy_one'], 1)} | {fmt(f['greedy_shipped'], 1)} | "
            f"{fmt(f['beam_shipped'], 1)} | {bucketed} |"
        )
    speeds = ["greedy_one", "greedy_shipped", "beam_shipped", "bucketed"]
    return lines + ratio_rows(results, rows, speeds, [], 0)


def batches(results: dict[str, Any]) -> list[str]:
    """The training batches: the padded share, and whether every system had the same."""
    trains = {
        n: r["train"]["batches"] for n, r in results["systems"].items() if "batches" in r["train"]
    }
    if not trains:
        return []
    b = next(iter(trains.values()))
    digests = {n: t["digest"] for n, t in trains.items()}

    def share(side: str, p: dict[str, Any]) -> str:
        padded, real = p[f"{side}_padded_tokens"], p[f"{side}_tokens"]
        return f"{100 * p[f'{side}_pad_share']:.1f} % ({padded - real:,} of {padded:,} tokens)"

    lines = [
        "",
        f"**Training batches.** {b['batches']} timed batches of {min(b['sentences'])}–"
        f"{max(b['sentences'])} sentence pairs in random order, each padded to its longest "
        f"sentence. Padded share (padding tokens / all tokens): source {share('src', b)}, "
        f"target {share('tgt', b)}. A system that skips padding saves up to that share of the "
        "work; one that computes every position does not.",
    ]
    if len(set(digests.values())) == 1:
        lines[-1] += (
            f" Every system trained on these very batches (digest {b['digest']}, taken in "
            "each system's own process)."
        )
    else:
        lines[-1] += (
            " **The systems' training batches differ** ("
            + ", ".join(f"{n} {d}" for n, d in digests.items())
            + "): the training figures do not compare."
        )
    for name in qkv_systems(results):
        p = results["systems"].get(name, {}).get("train", {}).get("bucketed", {}).get("padding")
        if p:
            lines.append(
                f"{name}'s own length-bucketed batches of the same pairs ({p['batches']} timed): "
                f"padded share source {share('src', p)}, target {share('tgt', p)}."
            )
    return lines


def rounds(results: dict[str, Any]) -> list[str]:
    """Each round's like-for-like decoding speeds, and qkv's ratio to each system round by
    round."""
    decoded = {n: r["decode"] for n, r in results["systems"].items() if "greedy" in r["decode"]}
    if QKV not in decoded or len(decoded[QKV]["greedy"].get("rounds", [])) < 2:
        return []
    lines = ["", "### Decoding, round by round (like for like, sentences/s; qkv / system)", ""]
    for kind in ("greedy", "beam"):
        own = decoded[QKV].get(kind, {}).get("rounds")
        if not own:
            continue
        cells = []
        for name, d in decoded.items():
            speeds = d.get(kind, {}).get("rounds")
            if not speeds:
                continue
            text = f"{name} " + ", ".join(fmt(x, 1) for x in speeds)
            if name != QKV:
                ratios = (ratio(a, b) for a, b in zip(own, speeds, strict=True))
                text += " (" + ", ".join(ratios) + ")"
            cells.append(text)
        lines.append(f"- {kind}: " + "; ".join(cells) + ".")
    return lines


def pairs(results: dict[str, Any]) -> list[str]:
    if not results.get("pairs"):
        return []
    peak = results["peak"].get("peak_gflops")
    n = results["systems"].get(QKV, {}).get("train", {}).get("params", {}).get("non_embedding")
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
        for kind in ("greedy", "beam"):
            found = p.get("decode", {}).get(kind)
            if not found:
                continue
            speed = {(r["system"], r["workers"]): r for r in found}
            for workers in sorted({r["workers"] for r in found}, reverse=True):
                a, b = speed[p["a"], workers], speed[p["b"], workers]
                way = f"{workers} at once" if workers > 1 else "one at a time"
                lines.append(
                    f"| {kind} sent/s, {way} ({workers} × {a['threads_each']} threads) | "
                    f"{p['b']} | {fmt(a['sentences_per_s'], 1)} | "
                    f"{fmt(b['sentences_per_s'], 1)} | "
                    f"{ratio(a['sentences_per_s'], b['sentences_per_s'])} |"
                )
    return lines


def host_speed(results: dict[str, Any], pair: dict[str, Any]) -> str:
    """The pair phase's matmul probes beside those of qkv's own training phase: the MFU is
    against the peak of the peak phase, and a slower stretch of the host lowers it."""
    own = results["systems"].get(QKV, {}).get("train", {}).get("probe_gflops") or []
    here = pair.get("probe_gflops") or []
    if not own or not here:
        return ""
    return (
        f"probes {min(here):.0f}–{max(here):.0f} GFLOP/s "
        f"(qkv's training phase: {min(own):.0f}–{max(own):.0f})"
    )


def settings(results: dict[str, Any]) -> list[str]:
    """How each system was set up, as its own processes reported it."""
    lines = ["", "### Systems", ""]
    for name, r in results["systems"].items():
        train, decode = r.get("train", {}), r.get("decode", {})
        meta = train.get("meta") or decode.get("meta") or {}
        keys = ("impl", "attention", "kv_cache", "threads", "export")
        parts = [meta.get(k) for k in keys if meta.get(k)]
        if train.get("optimizer"):
            parts.append(f"optimizer {train['optimizer']}")
        tuned = {x.get("allocator_tuned") for x in (train, decode) if "allocator_tuned" in x}
        if tuned:
            parts.append("allocator tuned" if tuned == {True} else "allocator NOT tuned")
        package = train.get("qkv_package") or decode.get("qkv_package")
        if package:
            tree = results.get("trees", {}).get(name, {})
            commit = tree.get("commit") or "no git commit"
            dirty = ", with uncommitted changes" if tree.get("dirty") else ""
            parts.append(f"package {package} ({commit}{dirty})")
        lines.append(f"- **{name}**: " + "; ".join(parts) + ".")
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
            f"Matmul probe during the phases: {min(probes):.0f}–"
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
        f", torch.mm {fmt(mm, 1)}: the peak of the reference protocol; an MFU against it is "
        f"{r['peak_gflops'] / mm:.2f}× the one given here)."
    )


def protocol(results: dict[str, Any]) -> str:
    a = results["args"]
    n = split_workers(results)
    text = (
        "Training: not measured (`--no-train`). "
        if a.get("no_train")
        else f"Training: {a['warmup']} warm-up + {a['steps']} timed steps of "
        f"≥{a['batch_tokens']} target tokens, median of {a['repeats']} passes; label "
        "smoothing 0.1, attention dropout 0.0 and dropout 0.1 elsewhere for every system. "
    )
    if a.get("no_decode"):
        return text + "Decoding: not measured (`--no-decode`)."
    text += (
        f"Decoding: {a['sentences']} sentences, batch {a['infer_batch']}, exactly "
        f"{a['new_tokens']} new tokens, median of every pass of {a.get('decode_rounds', 1)} "
        "round(s) (each system's phase once a round, in a fresh process, the systems taking "
        "turns). "
    )
    if n > 1:
        text += (
            f"Greedy like for like: every system decodes {n} batches at once, each in a worker "
            f"thread of {max(1, a['threads'] // n)} torch thread(s) (what `qkv translate` does "
            "on a CPU, given to every peer too); beam search one batch at a time for every "
            "system (qkv's default too)."
        )
    else:
        text += "Every system decodes one batch at a time."
    if a.get("device") == "cuda":
        text += (
            " On the GPU every timed batch first runs once untimed (a new shape's first step"
            " costs about 0.4 s there, once per process)."
        )
    return text


def render(results: dict[str, Any]) -> str:
    a, v = results["args"], results["versions"]
    lines = [
        "# qkv speed benchmark",
        "",
        f"{results['generated']}; {v['cpu']}; {a['threads']} torch threads; torch {v['torch']}, "
        f"transformers {v['transformers']}, x-transformers {v['x-transformers']}, "
        f"ctranslate2 {v.get('ctranslate2', 'not recorded')}. "
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
        "MFU = 6 × non-embedding parameters × non-pad target tokens/s / peak. Every worker "
        f"process ran with the same environment and allocator ({results.get('allocator')}).",
        "",
        protocol(results),
        *batches(results),
        "",
        *headline(results),
        *as_shipped(results),
        *rounds(results),
        *pairs(results),
        *settings(results),
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
