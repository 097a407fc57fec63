"""The routing table in words: bucket and match names, precedence keys, what a rule
does once it won (``check``, ``explain``, ``/debug/routes``, debug logs)."""

from __future__ import annotations

from routing.compiled import CompiledRule
from routing.matchers import CompiledMatch
from routing.retry import describe as describe_retry, describe_constraint


def bucket_name(pattern: str) -> str:
    if not pattern:
        return "default (no hostnames)"
    kind = "wildcard" if pattern.startswith("*.") else "exact"
    return f"{kind} {pattern!r}"


def match_name(match: CompiledMatch) -> str:
    rule = match.owner.rule
    where = f"rules[{match.rule_index}]"
    return where + (f".matches[{match.match_index}]" if rule.matches else " (no matches)")


def format_key(key: tuple) -> str:
    """A precedence key in words, most significant first."""
    kind, length, method, headers, queries, rule, match = key
    names = {3: "Exact", 2: "RegularExpression", 1: "PathPrefix"}
    return (f"{names[kind]}, length {length}, method {'yes' if method else 'no'}, "
            f"{headers} header(s), {queries} query param(s), rule {-rule}, match {-match}")


def targets_text(rule: CompiledRule) -> str:
    """Where ``rule`` sends a request, in one line (``check``'s table)."""
    if rule.rule.unavailable_status:
        return f"status {rule.rule.unavailable_status}"
    kinds = [f.type for f in rule.rule.filters]
    if "RequestRedirect" in kinds:
        return "redirect"
    total = sum(max(b.weight, 0) for b in rule.rule.backends)
    targets = ", ".join(f"{b.url} ({b.weight}/{total})" for b in rule.rule.backends)
    policy = rule.rule.retry
    return (targets or "no backends") + ("" if policy is None else
                                         f"; {describe_retry(policy)}")


def describe_rule(rule: CompiledRule, indent: str = "") -> list[str]:
    """What happens once ``rule`` won: status, filters, backends with weights, deadline."""
    spec = rule.rule
    lines = [f"{indent}rule rules[{rule.index}] hostnames {list(spec.hostnames)}"
             + ("" if spec.entrances is None else f" entrances {list(spec.entrances)}")]
    if spec.unavailable_status:
        lines.append(f"{indent}answers status {spec.unavailable_status}; nothing else runs")
        return lines
    for f in spec.filters:
        lines.append(f"{indent}filter {f.type}")
    total = sum(max(b.weight, 0) for b in spec.backends)
    for b in spec.backends:
        share = f"{100 * b.weight / total:.1f}%" if total > 0 else "0%"
        extra = [f"status {b.unavailable_status}"] if b.unavailable_status else []
        extra += [b.protocol] if b.protocol else []
        extra += ["tls"] if b.tls else []
        extra += ["websocket"] if b.websocket else []
        extra += [f"{len(b.filters)} filter(s)"] if b.filters else []
        extra += ([describe_constraint(b.retry_constraint)]
                  if spec.retry is not None else [])
        lines.append(f"{indent}backend {b.url} weight {b.weight} ({share})"
                     + (f" [{', '.join(extra)}]" if extra else ""))
    if not spec.backends or total <= 0:
        if "RequestRedirect" not in {f.type for f in spec.filters}:
            lines.append(f"{indent}no selectable backend: answers 500")
    if rule.deadline is not None:
        lines.append(f"{indent}deadline {rule.deadline:g}s for the response headers")
    if spec.retry is not None:
        lines.append(f"{indent}{describe_retry(spec.retry)}")
    return lines
