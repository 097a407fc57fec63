"""The config series (``tunnelgate_config_*``): what the config API made current,
when, and what it refused (plain single-process values, see :class:`ConfigMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.observability.children import LocalMetric


class ConfigMetrics:
    """The config series (``tunnelgate_config_*``), written by the process that runs
    the config API: the only process that knows every push, so they are never
    multiprocess values, even with ``--workers``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.version = LocalMetric(
            "gauge", "tunnelgate_config_version", "Version of the config being served.",
            registry=registry)
        self.rules = LocalMetric(
            "gauge", "tunnelgate_config_rules", "Rules in the config being served.",
            registry=registry)
        self.last_applied = LocalMetric(
            "gauge", "tunnelgate_config_last_applied_timestamp_seconds",
            "Unix time the config being served was applied.", registry=registry)
        self.pushes = LocalMetric(
            "counter", "tunnelgate_config_pushes", "Config pushes by result and status.",
            ("result", "status"), registry=registry)
        self.applies = LocalMetric(
            "counter", "tunnelgate_config_applies",
            "Attempts to make a config current, by source (file, push) and result.",
            ("source", "result"), registry=registry)
        self.last_attempt_successful = LocalMetric(
            "gauge", "tunnelgate_config_last_attempt_successful",
            "1 if the last attempt to apply a config succeeded (or none was made), "
            "0 if it was rejected.", registry=registry)
        self.last_attempt_successful.set(1.0)
        self.last_attempt = LocalMetric(
            "gauge", "tunnelgate_config_last_attempt_timestamp_seconds",
            "Unix time of the last attempt to apply a config (0: none yet).",
            registry=registry)
        self.rules_built = LocalMetric(
            "counter", "tunnelgate_config_rules_built",
            "Rules that config pushes decoded and validated (step=validated) or "
            "compiled (step=compiled); a rule the previous push already had costs "
            "neither.", ("step",), registry=registry)

    def built(self, validated: int, compiled: int) -> None:
        """Pushes decoded and validated ``validated`` more rules, compiled ``compiled``."""
        self.rules_built.labels("validated").inc(validated)
        self.rules_built.labels("compiled").inc(compiled)

    def applied(self, version: int, rules: int, when: float) -> None:
        """A config became current (a push, a start-up file, a reload)."""
        self.version.set(version)
        self.rules.set(rules)
        self.last_applied.set(when)

    def attempted(self, source: str, applied: bool, when: float) -> None:
        """A config from ``source`` was made current (``applied``) or rejected."""
        self.applies.labels(source, "applied" if applied else "rejected").inc()
        self.last_attempt_successful.set(1.0 if applied else 0.0)
        self.last_attempt.set(when)

    def pushed(self, status: int) -> None:
        """A ``PUT /config`` was answered ``status``: 200 ⇒ ``applied``, else
        ``rejected`` with the status code."""
        result = "applied" if status == 200 else "rejected"
        self.pushes.labels(result, str(status)).inc()
