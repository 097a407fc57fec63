"""Tenant regexes cannot exhaust memory or stall the loop (routing.regex limits), end to
end over the real config API and the real cluster entrance.

The reproduction that motivated the limits: 4,000 ``RegularExpression`` rules
``/[a-z]{1000}/N`` (a 575 KB push) took RSS from 40 to 370 MB on push and to 860 MB
after one request with a 1,000-character path, which held the event loop for seconds.
"""

from __future__ import annotations

import json
from typing import Any

from routing.regex import MAX_CONFIG_PROGRAM_SIZE, MAX_PROGRAM_SIZE, MAX_SUBJECT_BYTES
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_e2e_routing import LISTEN, ask, rule, served_by


def regex_rule(pattern: str, url: str, name: str = "regex") -> dict[str, Any]:
    return rule(name, url, matches=[{"path": {"type": "RegularExpression",
                                              "value": pattern}}])


def many_regex_rules(count: int, repeat: int, url: str) -> dict[str, Any]:
    """``count`` untagged rules ``/[a-z]{repeat}/N`` (as reported), then a tagged one."""
    rules: list[dict[str, Any]] = [
        {"matches": [{"path": {"type": "RegularExpression", "value": f"/[a-z]{{{repeat}}}/{i}"}}],
         "backends": [{"url": url, "weight": 1}]} for i in range(count - 1)]
    rules.append(regex_rule(f"/[a-z]{{{repeat}}}/{count - 1}", url, "last"))
    return {"version": 2, "rules": rules}


async def test_the_reported_regex_config_is_rejected_naming_the_first_regex():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [rule("old", echo.url)]}
        async with running(*LISTEN, config=config) as stack:
            response = await stack.push(many_regex_rules(4000, 1000, echo.url))
            assert response.status_code == 400, response.text
            assert response.text.startswith(
                "invalid config: rules[0].matches[0].path.value: regular expression "
                "'/[a-z]{1000}/0' compiles to 1007 instructions, more than the limit of "
                f"{MAX_PROGRAM_SIZE}"), response.text
            assert served_by(await ask(stack.cluster_port, "any.test")) == "old"


async def test_regexes_over_the_per_config_budget_are_rejected_at_the_first_one_past_it():
    # Each /[a-z]{990}/N is within the per-regex limit (~1,000 instructions); together
    # they pass the budget at rule `past`.
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [rule("old", echo.url)]}
        async with running(*LISTEN, config=config) as stack:
            response = await stack.push(many_regex_rules(4000, 990, echo.url))
            assert response.status_code == 400, response.text
            past = MAX_CONFIG_PROGRAM_SIZE // 997  # instructions of /[a-z]{990}/N, N < 100
            assert response.text == (
                f"invalid config: rules[{past}].matches[0].path.value: the config's "
                "regular expressions compile to more than "
                f"{MAX_CONFIG_PROGRAM_SIZE} instructions in total\n"), response.text
            assert served_by(await ask(stack.cluster_port, "any.test")) == "old"


async def test_a_header_regex_over_the_limit_is_named_by_its_field():
    async with TestBackend() as echo:
        async with running(*LISTEN) as stack:
            match = {"headers": [{"type": "Exact", "name": "a", "value": "1"},
                                 {"type": "RegularExpression", "name": "b",
                                  "value": "(x|y){900}"}]}
            response = await stack.push({"version": 1, "rules": [
                rule("h", echo.url, matches=[{"method": "GET"}, match])]})
            assert response.status_code == 400, response.text
            assert "rules[0].matches[1].headers[1].value: regular expression" in response.text


async def test_a_regex_never_matches_a_subject_longer_than_the_limit():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [regex_rule("/a/[a-z]*", echo.url),
                                          rule("fallback", echo.url)]}
        async with running(*LISTEN, config=config) as stack:
            fits = "/a/" + "x" * (MAX_SUBJECT_BYTES - 3)
            assert served_by(await ask(stack.cluster_port, "h.test", fits)) == "regex"
            longer = fits + "x"
            assert served_by(await ask(stack.cluster_port, "h.test", longer)) == "fallback"


async def test_a_large_regex_config_within_the_limits_is_served():
    # 40 rules of ~1,000 instructions: inside both limits, and a long path through all
    # of them is answered (the one that matches is the last).
    async with TestBackend() as echo:
        async with running(*LISTEN) as stack:
            config = many_regex_rules(40, 990, echo.url)
            assert (await stack.push(json.loads(json.dumps(config)))).status_code == 200
            path = "/" + "q" * 990 + "/39"
            assert served_by(await ask(stack.cluster_port, "h.test", path)) == "last"
