"""Retries (GEP-1731) and retry budgets (GEP-3388) end to end: a real tunnelgate
(``tests.stack.running``) in front of misbehaving loopback backends
(:class:`tests.flaky.FlakyBackend`); outcomes are read from the client's answers, the
backends' counts and the proxy's ``/metrics``."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any, AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.exchange.retry import RESOLUTION, _Window
from tests.flaky import FlakyBackend, refused_url
from tests.test_h2c import H2Backend
from tests.stack import Stack, running
from tests.test_e2e_routing import LISTEN, ask

HOST = "app.test"
# Half the first tries fail in some tests: more than the default budget lets retry.
NO_BUDGET = {"budget": {"percent": 100}}


def rule(*backends: str, retry: dict[str, Any] | None = None,
         timeouts: dict[str, str] | None = None, **backend_fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"hostnames": [HOST],
                           "backends": [{"url": url, "weight": 1, **backend_fields}
                                        for url in backends]}
    if retry is not None:
        out["retry"] = retry
    if timeouts is not None:
        out["timeouts"] = timeouts
    return out


@contextlib.asynccontextmanager
async def proxy(*rules: dict[str, Any], flags: tuple[str, ...] = (),
                environ: dict[str, str] | None = None) -> AsyncIterator[Stack]:
    async with running(*LISTEN, "--outlier-consecutive", "0", *flags, environ=environ,
                       config={"version": 1, "rules": list(rules)}) as stack:
        yield stack


async def metric(stack: Stack, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{stack.admin_url}/metrics")).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def failing(count: int, status: str | int) -> str:
    """A target whose first ``count`` requests fail with ``status`` (a fresh id)."""
    return f"/?id={uuid.uuid4().hex}&fail={count}&status={status}"


# The conformance table (HTTPRouteRetry): codes [500], 3 attempts.
@pytest.mark.parametrize("fail, status, expected, tries", [
    (0, 500, 200, 1),
    (2, 500, 200, 3),
    (3, 500, 200, 4),  # 3 retries: the fourth try succeeds
    (4, 500, 500, 4),  # out of retries: the last answer is relayed
    (1, 503, 503, 1),  # 503 is not listed: never retried
    (2, "reset", 200, 3),  # reset before any byte: retried whatever the codes
    (4, "reset", 503, 4),  # every try failed on a connection error: 503
])
async def test_retries_listed_codes_and_connection_errors(fail, status, expected, tries):
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, retry={"codes": [500], "attempts": 3, "backoff": "1ms"})
    ) as stack:
        response = await ask(stack.cluster_port, HOST, failing(fail, status))
        assert response.status == expected
        assert backend.hits == tries
        assert await metric(stack, "tunnelgate_retry_attempts_total") == tries


@pytest.mark.parametrize("fail, status, expected", [
    (1, 500, 500), (1, "reset", 502)])
async def test_without_a_policy_nothing_is_retried_and_statuses_stay(fail, status, expected):
    async with FlakyBackend() as backend, proxy(rule(backend.url)) as stack:
        response = await ask(stack.cluster_port, HOST, failing(fail, status))
        assert (response.status, backend.hits) == (expected, 1)


async def test_a_refused_backend_is_retried_on_another():
    """Two backends, one refusing connections: every request is served by the other;
    without a policy about half of them get 502."""
    async with FlakyBackend() as good:
        refused = refused_url()
        async with proxy(rule(refused, good.url, retry={"attempts": 1, "backoff": "1ms"},
                              retryConstraint=NO_BUDGET)) as stack:
            statuses = [(await ask(stack.cluster_port, HOST, "/")).status for _ in range(20)]
            assert statuses == [200] * 20
            assert await metric(stack, "tunnelgate_retries_total", reason="connection") > 0
        async with proxy(rule(refused, good.url)) as stack:
            statuses = [(await ask(stack.cluster_port, HOST, "/")).status for _ in range(20)]
            assert set(statuses) == {200, 502}


async def test_all_backends_refusing_answer_503_with_a_policy():
    async with proxy(rule(refused_url(), retry={"attempts": 2, "backoff": "1ms"})) as stack:
        assert (await ask(stack.cluster_port, HOST, "/")).status == 503
    async with proxy(rule(refused_url())) as stack:
        assert (await ask(stack.cluster_port, HOST, "/")).status == 502


async def test_nothing_is_retried_once_the_response_started():
    """A 200 head went out, then the backend reset mid-body: the client's answer is
    cut off, and the backend saw one request."""
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, retry={"codes": [500, 502], "attempts": 3, "backoff": "1ms"})
    ) as stack:
        backend.broken_body = True
        with pytest.raises(Exception):
            await ask(stack.cluster_port, HOST, "/")
        assert backend.hits == 1
        assert await metric(stack, "tunnelgate_retries_total") == 0


async def test_tries_stay_within_the_request_timeout():
    """A backend that never answers, 10 retries allowed, each try bounded to 100ms by
    backendRequest and all of them to 300ms by request: the client gets 504 and at
    most three tries (each lasts at least 100ms) were made."""
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, retry={"codes": [504], "attempts": 10, "backoff": "1ms"},
                 timeouts={"request": "300ms", "backend": "100ms"})) as stack:
        backend.status = "hang"
        response = await ask(stack.cluster_port, HOST, "/")
        assert response.status == 504
        assert 1 <= backend.hits <= 3
        assert await metric(stack, "tunnelgate_retries_skipped_total",
                            reason="deadline") == 1


@pytest.mark.parametrize("size, tries, expected", [
    (1024, 2, 200),  # kept whole: replayed to the second try
    (64 * 1024, 2, 200),  # the bound itself
    (64 * 1024 + 1, 1, 500),  # over the bound: streamed, not retried
])
async def test_a_body_is_replayed_only_within_the_bound(size, tries, expected, capsys):
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, retry={"codes": [500], "attempts": 1, "backoff": "1ms"}),
            environ={"PROXY_ACCESS_LOG_ENABLED": "1"}) as stack:
        response = await ask(stack.cluster_port, HOST, failing(1, 500), method="POST",
                             body=body)
        assert response.status == expected
        assert backend.bodies == [body] * tries
        skipped = await metric(stack, "tunnelgate_retries_skipped_total", reason="body")
        assert skipped == (1 if tries == 1 else 0)
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["attempts"] == tries
    assert line.get("retry") == (None if tries == 2 else
                                 "not retried: request body over 65536 bytes")


async def test_the_budget_stops_a_retry_storm():
    """A backend failing every request, 3 retries allowed per request, a budget of 20 %
    of the requests with no minimum rate: retries stay within 20 % of all tries, and
    the requests denied a retry get 503 (GEP-3388)."""
    constraint = {"budget": {"percent": 20, "interval": "1h"},
                  "minRetryRate": {"count": 0, "interval": "1s"}}
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, retry={"codes": [500], "attempts": 3, "backoff": "1ms"},
                 retryConstraint=constraint)) as stack:
        backend.status = 500
        statuses = [(await ask(stack.cluster_port, HOST, "/")).status for _ in range(40)]
        tries = await metric(stack, "tunnelgate_retry_attempts_total")
        retries = await metric(stack, "tunnelgate_retries_total")
        assert tries == backend.hits == 40 + retries
        assert 0 < retries <= 0.2 * tries
        denied = await metric(stack, "tunnelgate_retries_skipped_total", reason="budget")
        assert statuses.count(503) == denied > 0


async def test_a_minimum_retry_rate_allows_retries_beyond_the_percentage():
    constraint = {"budget": {"percent": 0}, "minRetryRate": {"count": 3, "interval": "1h"}}
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, retry={"codes": [500], "attempts": 1, "backoff": "1ms"},
                 retryConstraint=constraint)) as stack:
        backend.status = 500
        for _ in range(6):
            await ask(stack.cluster_port, HOST, "/")
        assert await metric(stack, "tunnelgate_retries_total") == 3


# ------------------------------------------------------------------ h2c backends


async def test_h2c_backends_are_retried_in_the_same_exchange():
    """The awaited path (HTTP/2 backends) takes the same retries: a refused h2c
    backend beside a good one never shows, and a hanging one is retried within the
    request timeout."""
    async with H2Backend() as good:
        async with proxy(rule(refused_url(), good.url, protocol="h2c",
                              retry={"attempts": 1, "backoff": "1ms"},
                              retryConstraint=NO_BUDGET)) as stack:
            statuses = [(await ask(stack.cluster_port, HOST, "/")).status for _ in range(10)]
            assert statuses == [200] * 10
        async with proxy(rule(good.url, protocol="h2c",
                              retry={"codes": [504], "attempts": 10, "backoff": "1ms"},
                              timeouts={"request": "300ms", "backend": "100ms"})) as stack:
            before = len(good.requests)
            assert (await ask(stack.cluster_port, HOST, "/hang")).status == 504
            assert 1 <= len(good.requests) - before <= 3


def test_the_budget_window_slides_and_stays_bounded():
    """proxy.exchange.retry's window: events leave it exactly ``span`` later, and what
    left is dropped even when nobody asks for the count."""
    window = _Window(10.0)
    for i in range(3 * RESOLUTION):
        window.add(i * 0.001)  # 30 s of one event per ms
    assert len(window.events) <= RESOLUTION + 1
    assert window.count(30.0) == RESOLUTION - 1  # (20.0, 30.0): 9,999 ms of events
    assert window.count(40.0) == 0
