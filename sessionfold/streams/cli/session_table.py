"""The human view of one session's projections, shared by `fold`, `replay` and `state`."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def session_table(session_id: str, state: dict[str, Any]) -> Table:
    """One session's projections (the `fold --json` shape) as a two-column table."""
    table = Table(title=f"session {session_id}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    metrics = state["metrics"]
    attempts = state["flush_attempts"]
    outcomes: dict[str, int] = {}
    for attempt in attempts:
        outcomes[attempt["outcome"]] = outcomes.get(attempt["outcome"], 0) + 1
    frontier = state["frontier"]
    roles = state["counts"]["messages"]
    stats = state["stats"]
    table.add_row("messages", ", ".join(f"{role} {n}" for role, n in roles.items()) or "0")
    table.add_row(
        "flush attempts",
        f"{len(attempts)}" + (f" ({_counts(outcomes)})" if outcomes else ""),
    )
    table.add_row("pending batches", str(state["pending_batches"]))
    table.add_row(
        "frontier",
        "none"
        if frontier is None
        else f"turn {frontier['last_attempted_turn_index']}, {frontier['outcome']}",
    )
    table.add_row("open-cycle thinking", f"{metrics['open_cycle_thinking_tokens']:,} tokens")
    table.add_row("largest-chain share", f"{metrics['largest_chain_share_pct']}%")
    table.add_row("frontier gap", f"{metrics['frontier_gap_tokens']:,} tokens")
    table.add_row(
        "summarized",
        f"{stats['summarized_calls']} calls in {stats['summaries']} summaries, "
        f"{stats['deduped_calls']} deduped, {stats['spilled_calls']} spilled; "
        f"~{stats['reclaimed_chars'] // 4:,} tokens reclaimed",
    )
    table.add_row("dead letters", str(state["dead_letters"]))
    anomalies = (state.get("ledger") or {}).get("anomalies") or []
    calls = sum(a.get("calls", 0) for a in anomalies if a["code"] == "call-without-result")
    results = sum(1 for a in anomalies if a["code"] == "result-without-call")
    if calls or results:
        # what a provider would refuse: the context answers the calls and leaves the results out
        table.add_row(
            "unpaired",
            f"{calls} calls without a result, {results} results without a call "
            "(ledger --anomalies)",
        )
    return table


def _counts(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(outcomes.items()))
