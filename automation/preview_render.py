"""The preview report as text for a terminal, JSON for machines, Markdown for a pull-request comment."""

from __future__ import annotations

from automation.preview_model import PROXY_OPS, PoolPreview, PreviewReport, StackPreview

SYMBOLS = {"create": "+", "update": "~", "replace": "+-", "delete": "-", "keep": " "}
NAMES_DRAWN = "new children's names are drawn again at apply"
TITLE = "proxy-operator preview"


def render_json(report: PreviewReport) -> str:
    return report.model_dump_json(by_alias=True, indent=2)


def render_text(report: PreviewReport) -> str:
    lines: list[str] = []
    for stack in report.stacks:
        lines.append(f"stack {stack.name}: {_state(stack)}")
        lines.extend(f"  {SYMBOLS[op]:<2} {op:<7} {key}{_fields(stack, key)}" for op, key in _rows(stack))
        if stack.resource_changes:
            lines.append(f"  resources: {_counts(stack.resource_changes)}")
        lines.extend(f"  skipped {key}: {why}" for key, why in sorted(stack.skipped.items()))
    for pool in report.pools:
        lines.append(f"pool {pool.pool}: {_pool_headline(pool)}")
        lines.extend(f"  {SYMBOLS[c.change]:<2} {c.change:<7} {c.name}  {c.placement}" for c in pool.children)
    lines.extend(f"{word}: {text}" for word, text in _decision_lines(report))
    lines.extend(f"problem: {problem}" for problem in report.problems)
    lines.append(_summary(report))
    return "\n".join(lines)


def render_markdown(report: PreviewReport) -> str:
    lines = [f"### {TITLE}", "", _summary(report), ""]
    lines += ["| Stack | Operation | Create | Update | Replace | Delete | Result |"]
    lines += ["|---|---|---:|---:|---:|---:|---|"]
    for stack in report.stacks:
        counts = " | ".join(str(stack.proxies.count(op)) for op in PROXY_OPS)
        lines.append(f"| `{_cell(stack.name)}` | {stack.operation} | {counts} | {_result(stack)} |")
    for stack in report.stacks:
        lines += ["", *_details(stack)]
    if report.pools:
        lines += ["", "**Pools**", ""]
        for pool in report.pools:
            lines += [f"- `{_cell(pool.pool)}`: {_cell(_pool_headline(pool))}"]
            lines += [f"  - {c.change} `{_cell(c.name)}` on `{_cell(c.placement)}`" for c in pool.children]
    decisions = _decision_lines(report)
    if decisions:
        lines += ["", "**Decisions**", "", *(f"- **{word}** {_cell(text)}" for word, text in decisions)]
    if report.problems:
        lines += ["", "**Problems**", "", *(f"- {_cell(problem)}" for problem in report.problems)]
    return "\n".join(lines) + "\n"


def _decision_lines(report: PreviewReport) -> list[tuple[str, str]]:
    """Held, refused, deleted, left alone, and a removal the deletion budget would stop."""
    d = report.decisions
    lines = [("stopped", d.deletion_budget)] if d.deletion_budget else []
    lines += [("held", f"{key}: {why}") for key, why in sorted(d.held.items())]
    lines += [("deleted", f"{key}: removed from a complete read of the manifests") for key in d.deleted]
    lines += [("left alone", f"stack {name}: {why}") for name, why in sorted(d.foreign.items())]
    return lines


# --- pieces ---------------------------------------------------------------------------------------------


def _rows(stack: StackPreview) -> list[tuple[str, str]]:
    return [(op, key) for op in PROXY_OPS for key in getattr(stack.proxies, op)]


def _fields(stack: StackPreview, key: str) -> str:
    """The input fields whose change drives a proxy's update or replacement, if the engine named them."""
    diffs = sorted({diff for step in stack.steps if step.proxy == key for diff in step.diffs})
    return f" ({', '.join(diffs)})" if diffs else ""


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} {number}" for op, number in counts.items())


def _state(stack: StackPreview) -> str:
    if stack.error:
        return f"{stack.operation}: preview FAILED: {stack.error}"
    if stack.operation == "none" and not stack.previewed:
        return "unchanged (applied hash matches), not previewed"
    if not stack.changed:
        return f"{stack.operation}: no changes"
    return stack.operation


def _result(stack: StackPreview) -> str:
    if stack.error:
        return "failed"
    if not stack.previewed:
        return "unchanged"
    return "changes" if stack.changed else "no changes"


def _pool_headline(pool: PoolPreview) -> str:
    changes = ", ".join(f"{pool.count(c)} to {c}" for c in ("create", "keep", "delete") if pool.count(c))
    drawn = f" ({NAMES_DRAWN})" if pool.count("create") else ""
    return f"{pool.desired} desired; {changes or 'no children'}{drawn}"


def _summary(report: PreviewReport) -> str:
    totals = report.totals
    proxies = ", ".join(f"{getattr(totals, op)} to {op}" for op in PROXY_OPS)
    return (
        f"{totals.stacks} stack(s), {totals.changed_stacks} with changes, {totals.failed_stacks} failed; "
        f"proxies: {proxies}"
    )


def _details(stack: StackPreview) -> list[str]:
    counts = ", ".join(f"{stack.proxies.count(op)} to {op}" for op in PROXY_OPS if stack.proxies.count(op))
    headline = f"{_state(stack)}: {counts}" if counts and not stack.error else _state(stack)
    summary = f"<code>{_html(stack.name)}</code>: {_html(headline)}"
    body: list[str] = []
    rows = _rows(stack)
    if rows:
        body += ["| Proxy | Change | Fields |", "|---|---|---|"]
        body += [f"| `{_cell(key)}` | {op} | {_cell(_fields(stack, key).strip(' ()'))} |" for op, key in rows]
    if stack.resource_changes:
        body += ["", f"Resources: {_counts(stack.resource_changes)}"]
    body += [f"- skipped `{_cell(key)}`: {_cell(why)}" for key, why in sorted(stack.skipped.items())]
    if stack.error:
        body += ["", "```", stack.error.replace("```", "'''"), "```"]
    if not body:
        body = ["Nothing to do."]
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>"]


def _cell(text: str) -> str:
    """Markdown table cells: a pipe or a newline would break the row."""
    return text.replace("|", "\\|").replace("\n", " ")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
