"""Config files: reading wire JSON or HTTPRoute YAML (or the ConfigMap manifest that
carries either: :mod:`routing.configmap`), the warnings ``check`` prints, and
re-reading ``--config`` on SIGHUP or when the file changes (``--watch-config``).

A re-read config is applied exactly as a ``PUT /config`` is (version ordering, compile,
with ``--workers N`` the fan-out to every worker); a file that cannot be read or is
rejected is logged at warning and the current config keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Awaitable, Callable

from proxy.control.pushbody import size_advice
from proxy.control.channel import encode_config
from routing.config import parse_config
from routing.configmap import Embedded, unwrap
from routing.gateway_api import Conversion, convert, locate
from routing.lint import lint, wire_label
from routing.model import Config, ConfigError
from routing.table import Table

log = logging.getLogger("tunnelgate.config")

# How often --watch-config looks at the file: a stat() a second is nothing, and a
# ConfigMap update reaches the pod's volume only after the kubelet's sync period anyway.
WATCH_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A config file read once: its text and config, for YAML the conversion, and
    for a ConfigMap manifest where in it the config was (``text`` is then the data
    value, the lines of messages are the manifest's)."""

    path: str
    text: str
    config: Config
    conversion: Conversion | None  # None for wire JSON
    embedded: Embedded | None = None

    def warnings(self, table: Table) -> list[str]:
        """``check``'s warnings, one line each, located like compiler messages:
        ``FILE: ...`` for JSON, ``FILE:LINE: HTTPRoute NS/NAME: PATH: ...`` for YAML."""
        size = size_advice(encode_config(self.config))
        pushed = [] if size is None else [f"{self.path}: warning: {size}"]
        conversion = self.conversion
        if conversion is None:
            return [f"{self.path}: warning: {f.message}"
                    for f in lint(self.config, table, wire_label)] + pushed
        paths = conversion.rule_paths
        findings = lint(self.config, table, lambda i: paths[i], statuses=False)
        located = [self._at(note.path, f"{note.path}: {note.message}")
                   for note in conversion.notes]
        located += [self._at(paths[f.rule], f.message) for f in findings
                    if f.rule is not None]
        lines = [f"{self.path}: warning: {f.message}" for f in findings if f.rule is None]
        lines += [f"{self.path}: warning: --backend {key} matches no Service reference"
                  for key in conversion.unused_backends]
        return (lines + [text for _, text in sorted(located, key=lambda pair: pair[0])]
                + pushed)

    def _at(self, yaml_path: str, message: str) -> tuple[int, str]:
        """(line, the warning located at ``yaml_path``); line 0 if unknown."""
        line, route = locate(self.text, yaml_path)
        if self.embedded is not None:
            line = self.embedded.line(line)
        where = f"{self.path}:{line}" if line is not None else self.path
        return line or 0, (f"{where}: warning: " + (f"HTTPRoute {route}: " if route else "")
                           + message)


class ConfigFileError(ValueError):
    """A config file with unacceptable content. Its text says where, like a compiler
    message: ``FILE[:LINE]: [HTTPRoute NS/NAME: ]FIELD: problem``; ``error`` is the
    parser's :class:`ConfigError`."""

    def __init__(self, path: str, error: ConfigError, line: int | None = None,
                 route: str | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: " + (f"HTTPRoute {route}: " if route else "")
                         + str(error))
        self.error = error
        self.line = line
        self.route = route


def read_config_file(path: str, backends: dict[str, str] | None = None) -> ConfigFile:
    """Read wire JSON or Gateway API HTTPRoute YAML (by extension, else by content), or
    the config inside a ConfigMap manifest (:func:`routing.configmap.unwrap`).

    ``backends`` maps ``NAME.NAMESPACE`` of a Service to a URL (YAML only). Raises
    :class:`ConfigFileError` (bad content) or ``OSError`` (unreadable file).
    """
    with open(path, encoding="utf-8") as handle:
        return read_config_text(handle.read(), path, backends)


def read_config_text(text: str, path: str,
                     backends: dict[str, str] | None = None) -> ConfigFile:
    """:func:`read_config_file` of ``text`` already read; ``path`` names it in messages
    (and, by its extension, says YAML)."""
    if not _is_yaml(path, text):
        try:
            return ConfigFile(path, text, parse_config(text), None)
        except ConfigError as err:
            raise ConfigFileError(path, err) from None
    try:
        embedded = unwrap(text)
    except ConfigError as err:
        raise ConfigFileError(path, err, *locate(text, err.path)) from None
    if embedded is None:
        return _converted(text, path, backends)
    try:
        if _is_yaml(embedded.key, embedded.text):
            inner = _converted(embedded.text, path, backends)
        else:
            inner = ConfigFile(path, embedded.text, parse_config(embedded.text), None)
    except ConfigError as err:  # wire JSON: no line of its own, the key's
        raise ConfigFileError(path, err, embedded.key_line) from None
    except ConfigFileError as exc:
        raise ConfigFileError(path, exc.error, embedded.line(exc.line), exc.route) from None
    return ConfigFile(path, inner.text, inner.config, inner.conversion, embedded)


def _is_yaml(name: str, text: str) -> bool:
    return name.endswith((".yaml", ".yml")) or not text.lstrip().startswith("{")


def _converted(text: str, path: str, backends: dict[str, str] | None) -> ConfigFile:
    try:
        conversion = convert(text, backends)
    except ConfigError as err:
        raise ConfigFileError(path, err, *locate(text, err.path)) from None
    return ConfigFile(path, text, conversion.config, conversion)


def load_config_file(path: str, backends: dict[str, str] | None = None) -> Config:
    """The config of :func:`read_config_file`."""
    return read_config_file(path, backends).config


def describe_error(path: str, exc: ConfigFileError | OSError) -> str:
    """What went wrong with config file ``path``, in one line starting with the file."""
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    return str(exc)


# --------------------------------------------------------------------------- reloading

Push = Callable[[Config], Awaitable[bool]]
"""Applies a config the way ``PUT /config`` does; False (already logged) if rejected."""
Refused = Callable[[str], None]
"""Told why the file could not be read or parsed (already logged), to record it."""


def file_signature(path: str) -> tuple[int, int, int, int] | None:
    """What changes when the file is replaced or rewritten: (device, inode, size, mtime)
    of the file ``path`` finally resolves to, or ``None`` if it cannot be stat'ed.

    Following symlinks matters for a mounted ConfigMap: the kubelet writes a new
    directory and swaps the ``..data`` symlink, so the file's own path never changes
    but it resolves to a new inode.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class ConfigReloader:
    """Re-reads ``path`` when asked (:meth:`request`, e.g. on SIGHUP) and, if
    ``watch``, whenever its :func:`file_signature` changes; requests that arrive while
    a reload runs are coalesced into one more reload after it. A file that cannot be
    read or parsed goes to ``refused``; a config that can, to ``push``."""

    def __init__(self, path: str, backends: dict[str, str], push: Push, *,
                 refused: Refused | None = None, watch: bool = False,
                 interval: float = WATCH_INTERVAL) -> None:
        self.path = path
        self.backends = backends
        self.push = push
        self.refused = refused
        self.watch = watch
        self.interval = interval
        self.signature = file_signature(path)  # taken before the file is first read
        self._wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def load(self) -> Config:
        """Read the file for start-up (the signature is the one taken before)."""
        return load_config_file(self.path, self.backends)

    def request(self, reason: str) -> None:
        log.info("config reload requested", extra={"file": self.path, "reason": reason})
        self._wanted.set()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._serve_requests()))
        if self.watch:
            self._tasks.append(asyncio.create_task(self._poll()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _serve_requests(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self.reload()

    async def reload(self) -> bool:
        """Read the file and push it; True if it was applied."""
        self.signature = file_signature(self.path)  # before reading: never miss a write
        try:
            config = await asyncio.to_thread(self.load)
        except (ConfigFileError, OSError) as exc:
            error = describe_error(self.path, exc)
            log.warning("config reload rejected: the current config keeps serving",
                        extra={"file": self.path, "error": error})
            if self.refused is not None:
                self.refused(error)
            return False
        return await self.push(config)

    async def _poll(self) -> None:
        missing = False
        while True:
            await asyncio.sleep(self.interval)
            signature = file_signature(self.path)
            if signature is None:
                if not missing:  # say it once, not every second
                    log.warning("watched config file is missing; keeping the current "
                                "config", extra={"file": self.path})
                missing = True
                continue
            missing = False
            if signature != self.signature:
                self.request("file changed")
