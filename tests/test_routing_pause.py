"""Cooperative pauses in long parses and compiles (routing.pause.Pause), and the
decoding of a push with its rules as raw text (routing.jsonscan).

A pushed 10,000-rule config is parsed and compiled in a worker thread; ``pause`` is how
that thread lets the event loop run. These tests pin that decoding a push rule by rule
gives exactly what ``json.loads`` gives for JSON (and refuses what is not JSON), that
pauses really happen, and that pausing changes nothing in the result.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.config import parse_config
from routing.jsonscan import loads, split_rules
from routing.model import ConfigError, Rule
from routing.pause import PAUSE_EVERY
from routing.reuse import RuleReuse
from routing.table import Table


def _never() -> None:
    raise AssertionError("no pause expected here")


def _decoded(text: str) -> object:
    """What parse_config's decoding step yields, every raw rule decoded (validation
    errors are not ours here)."""
    top, rules = split_rules(text.encode())
    if rules is not None:
        top["rules"] = [loads(raw) for raw in rules]
    return top


VALID = [
    '{"version":1,"rules":[]}',
    ' \n{ "rules" : [ {"hostnames":["a.example"]} , {} ] , "version" : 2 }\r\n\t',
    '{"rules":[1,[2,[3]],{"x":{"y":[]}}],"rules":[{"last":"wins"}]}',
    '{"rules":{"not":"an array"}}',
    '{"version":1}',
    '{}',
    '{"a\\"b":"c\\u00e9","rules":["\\u2603"]}',
    '[1,2,3]',
    '"a string"',
]

INVALID = [
    '', ' ', '{', '{"rules":[1,2', '{"rules":[1,]}', '{"rules":[1 2]}', '{"a" 1}',
    '{"a":1,}', '{a:1}', '{"a":1} x', '{"rules":[NaN]}', '{"v":Infinity}',
    '\ufeff{"a":1}', '{"rules":[{"a":1}]}]', "{'a':1}", '{"rules":[1e400]}',
    '{"version":1e400}', '{"rules":[{"a":"\\ud800"}]}',
]


@pytest.mark.parametrize("text", VALID)
def test_stepwise_decoding_equals_json_loads(text: str) -> None:
    assert _decoded(text) == json.loads(text)


@pytest.mark.parametrize("text", INVALID)
def test_invalid_json_is_the_same_400_with_and_without_pauses(text: str) -> None:
    with pytest.raises(ConfigError) as plain:
        parse_config(text)
    with pytest.raises(ConfigError) as paused:
        parse_config(text, pause=lambda: None, reuse=RuleReuse())
    assert (str(plain.value), plain.value.kind) == (str(paused.value), paused.value.kind)
    assert plain.value.kind == "json" and str(plain.value).startswith("invalid JSON: ")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                 inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(rules=st.lists(_JSON, max_size=300), other=st.dictionaries(
    st.text(max_size=6), _JSON, max_size=3), indent=st.sampled_from([None, 0, 2, "\t"]),
    spaced=st.booleans())
def test_rule_by_rule_decoding_round_trips_any_config_shaped_json(
        rules: list, other: dict, indent: object, spaced: bool) -> None:
    document = {**other, "rules": rules}
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(document, indent=indent, separators=separators)  # type: ignore[arg-type]
    assert _decoded(text) == json.loads(text)


def _config(rules: int, hosts: int = 50) -> str:
    return json.dumps({"version": 7, "rules": [
        {"hostnames": [f"app-{i % hosts}.example"],
         "matches": [{"path": {"type": "PathPrefix", "value": f"/p{i}"}}],
         "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]}
        for i in range(rules)]})


def test_parse_and_compile_pause_while_working_and_give_the_same_result() -> None:
    text = _config(3 * PAUSE_EVERY + 5)
    calls: list[str] = []
    paused = parse_config(text, pause=lambda: calls.append("parse"))
    assert paused == parse_config(text)
    assert calls.count("parse") >= 3  # between rules
    table = Table.compile(paused, pause=lambda: calls.append("compile"))
    assert calls.count("compile") >= 3
    plain = Table.compile(parse_config(text))
    assert table.describe() == plain.describe()


def test_small_configs_never_pause() -> None:
    text = _config(PAUSE_EVERY - 1)
    Table.compile(parse_config(text, pause=_never), pause=_never)


def test_a_replaced_table_is_released_in_steps() -> None:
    table = Table.compile(parse_config(_config(3 * PAUSE_EVERY, hosts=3 * PAUSE_EVERY)))
    assert table.lookup("app-1.example", "/p1", "", [], "GET", "tunnel") is not None
    calls: list[int] = []
    table.release(lambda: calls.append(1))
    assert len(calls) >= 1 and table.rules_count == 0
    assert table.lookup("app-1.example", "/p1", "", [], "GET", "tunnel") is None


def test_a_callers_decoded_config_is_not_taken_apart() -> None:
    wire = json.loads(_config(2 * PAUSE_EVERY))
    before = json.dumps(wire)
    parse_config(wire, pause=lambda: None)
    assert json.dumps(wire) == before


def test_a_rule_resent_byte_for_byte_is_recognised_without_decoding() -> None:
    rule = '{"hostnames":["a.example"],"backends":[{"url":"http://127.0.0.1:9","weight":1}]}'
    reuse = RuleReuse()
    first = parse_config('{"version":1,"rules":[%s,%s]}' % (rule, rule), None, reuse)
    assert reuse.validated == 1  # the second is the first, recognised by its text
    assert first.rules[0] is first.rules[1]
    # Spacing is part of the text: the same rule spaced otherwise is decoded again.
    again = parse_config('{"version":2, "rules":[%s, %s ]}' % (rule, rule.replace(
        ",", ", ")), None, reuse)
    assert reuse.validated == 2 and again.rules[0] is first.rules[0]
    assert again.rules[1] == first.rules[1] and again.rules[1] is not first.rules[1]


def test_pushes_with_changes_parse_the_same_as_a_fresh_parse() -> None:
    base = json.loads(_config(300))
    pushes = [base]
    changed = json.loads(json.dumps(base))
    changed["rules"][150]["matches"][0]["path"]["value"] = "/changed"
    pushes.append(changed)
    inserted = json.loads(json.dumps(changed))
    inserted["rules"].insert(0, {"backends": [{"url": "http://127.0.0.1:9"}]})
    pushes.append(inserted)
    pushes.append(base)
    reuse = RuleReuse()
    for version, wire in enumerate(pushes, start=1):
        text = json.dumps({**wire, "version": version})
        assert parse_config(text, lambda: None, reuse) == parse_config(json.loads(text))


def test_a_changed_rule_is_still_validated_with_its_path() -> None:
    wire = json.loads(_config(200))
    reuse = RuleReuse()
    parse_config(json.dumps(wire), lambda: None, reuse)  # the rules become known
    wire["rules"][170]["matches"][0]["path"]["type"] = "Foo"
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(wire), lambda: None, reuse)
    assert str(caught.value).startswith("rules[170].matches[0].path.type")


def test_a_moved_rule_is_found_by_its_text() -> None:
    wire = json.loads(_config(2 * PAUSE_EVERY))
    reuse = RuleReuse()
    first = parse_config(json.dumps(wire), lambda: None, reuse)
    again = parse_config(json.dumps({**wire, "version": 8}), lambda: None, reuse)
    assert all(a is b for a, b in zip(first.rules, again.rules))
    wire["rules"].insert(0, {"backends": [{"url": "http://127.0.0.1:9"}]})
    moved = parse_config(json.dumps({**wire, "version": 9}), lambda: None, reuse)
    assert all(a is b for a, b in zip(again.rules, moved.rules[1:]))


def test_nothing_is_reused_without_a_reuse_object() -> None:
    # No state outside the caller's RuleReuse: two plain parses share no rule, and a
    # parse with one RuleReuse does not leak into a parse with another.
    text = _config(PAUSE_EVERY)
    first, second = parse_config(text, lambda: None), parse_config(text, lambda: None)
    assert first == second and not any(a is b for a, b in zip(first.rules, second.rules))
    ours = RuleReuse()
    mine = parse_config(text, lambda: None, ours)
    theirs = parse_config(text, lambda: None, RuleReuse())
    assert not any(a is b for a, b in zip(mine.rules, theirs.rules))
    assert all(a is b for a, b in zip(mine.rules, parse_config(text, None, ours).rules))


def test_a_compile_reuses_only_what_its_reuse_object_holds() -> None:
    reuse = RuleReuse()
    config = parse_config(_config(10), None, reuse)
    first = Table.compile(config, reuse=reuse)
    again = Table.compile(config, reuse=reuse)
    fresh = Table.compile(config)
    assert all(a is b for a, b in zip(first.rules, again.rules))
    assert not any(a is b for a, b in zip(first.rules, fresh.rules))
