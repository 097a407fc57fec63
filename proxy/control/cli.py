"""The ``tunnelgate`` command: its subcommands, their flags and what each prints.

Subcommands: ``serve`` (run the proxy), ``check FILE`` (validate, print the compiled
table and warnings), ``explain FILE --host H --path P …`` (why a request goes where it
goes), ``convert FILE`` (HTTPRoute YAML → wire JSON), ``demo`` (two local backends and a
demo config) and ``cloudflared-config`` (a sidecar ingress section). The stable
contract is::

    tunnelgate serve --listen HOST:PORT --admin HOST:PORT [--config FILE] [--auth-token-file F]

``serve`` resolves its flags into :class:`~proxy.control.settings.Settings` and runs
:func:`proxy.control.runtime.serve`, the composition root of the runtime.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Sequence

from proxy.control import allocator, demo, native
from proxy.control.configfile import (
    ConfigFile, ConfigFileError, describe_error, read_config_file, read_config_text)
from proxy.control.debug import parse_header
from proxy.control.runtime import run, serve
from proxy.control.flags import (
    add_backend_argument, add_log_format_argument, add_serve_arguments)
from proxy.control.resolve import from_args, log_format, parse_backends
from proxy.control.settings import LOG_LEVELS, SettingsError
from proxy.observability.logs import configure_logging
from routing.decide import SCOPES, EntranceScope, explain
from routing.model import ENTRANCES, TUNNEL, Config
from routing.table import Table
from routing.wire import to_wire
from tunnel import sidecar

log = logging.getLogger("tunnelgate")


def _log_start() -> None:
    """The first log line: which version and build run (compiled or plain Python) and
    malloc tuning."""
    log.info("starting", extra={"version": native.version(), "build": native.describe(),
                                "malloc_tuned": allocator.tune()})


def version_line() -> str:
    """What ``tunnelgate --version`` and ``tunnelgate version`` print."""
    return f"tunnelgate {native.version()} ({native.build()} build: {native.describe()})"


def _cmd_version(args: argparse.Namespace) -> int:
    print(version_line())
    return 0


def _start_logging(args: argparse.Namespace) -> bool:
    """Log at ``--log-level`` in ``--log-format`` (``$PROXY_LOG_FORMAT``); False (said
    in the default format) if that format is unknown."""
    try:
        configure_logging(args.log_level, log_format(args.log_format, os.environ))
    except SettingsError as exc:
        configure_logging(args.log_level)
        log.error(str(exc))
        return False
    return True


def _cmd_serve(args: argparse.Namespace) -> int:
    if not _start_logging(args):
        return 2
    try:
        settings = from_args(args, os.environ)
    except SettingsError as exc:
        log.error(str(exc))
        return exc.exit_code
    _log_start()
    return run(serve(settings))


def _load_file(args: argparse.Namespace) -> ConfigFile | int:
    """The config file named by ``args.file`` (``-``: standard input) with ``--backend``
    applied, or the exit status after printing why it could not be read: 2 for a bad
    flag, 1 for a bad file."""
    try:
        backends = parse_backends(args.backend)
        if args.file == "-":
            return read_config_text(sys.stdin.read(), STDIN, backends)
        return read_config_file(args.file, backends)
    except SettingsError as exc:
        print(f"tunnelgate: {exc}", file=sys.stderr)
        return 2
    except (ConfigFileError, OSError) as exc:
        print(f"tunnelgate: {describe_error(args.file, exc)}", file=sys.stderr)
        return 1


STDIN = "<stdin>"  # how messages name a config read from standard input (``-``)


def _cmd_check(args: argparse.Namespace) -> int:
    loaded = _load_file(args)
    if isinstance(loaded, int):
        return loaded
    table = Table.compile(loaded.config)
    warnings = loaded.warnings(table)
    inside = f" ({loaded.embedded.describe()})" if loaded.embedded is not None else ""
    print(f"{loaded.path}: valid{inside}; version {loaded.config.version}")
    print("\n".join(table.describe()))
    for warning in warnings:
        print(warning, file=sys.stderr)
    if warnings and args.strict:
        print(f"tunnelgate: {loaded.path}: {len(warnings)} warning(s) and --strict",
              file=sys.stderr)
        return 1
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.admin is None):
        print("tunnelgate: explain needs either FILE or --admin URL", file=sys.stderr)
        return 2
    if args.admin is not None:
        return _explain_live(args)
    loaded = _load_file(args)
    if isinstance(loaded, int):
        return loaded
    try:
        headers: list[tuple[bytes, ...]] = [parse_header(h) for h in args.header]
    except ValueError as exc:
        print(f"tunnelgate: {exc}", file=sys.stderr)
        return 1
    scope = EntranceScope(args.cluster_scope or "all")
    entrance, via = _file_entrance(args.entrance, loaded.config, scope)
    table = Table.compile(loaded.config, scope.default_entrances)
    _, lines = explain(table, scope, args.method, args.host, args.path, args.query,
                       headers, entrance, random.random, via=via)
    print("\n".join(lines))
    return 0


def _file_entrance(asked: str | None, config: Config,
                   scope: EntranceScope) -> tuple[str, str | None]:
    """The entrance ``explain FILE`` evaluates and what its first line says of it. A
    file does not say how the proxy runs: without ``--entrance`` the answer is the
    same for every entrance unless a rule names some (or the cluster scope is
    ``scoped``, which keeps unnamed rules off the cluster entrances)."""
    if asked is not None:
        return asked, None
    if not scope.scoped and all(rule.entrances is None for rule in config.rules):
        return TUNNEL, "any entrance (no rule names entrances)"
    return TUNNEL, ("the tunnel entrance (the default; --entrance cluster for a "
                    "standalone proxy or in-cluster callers)")


def _cmd_convert(args: argparse.Namespace) -> int:
    loaded = _load_file(args)
    if isinstance(loaded, int):
        return loaded
    print(json.dumps(to_wire(loaded.config), indent=2))
    return 0


def _explain_live(args: argparse.Namespace) -> int:
    """``explain --admin URL``: the same lines, from the snapshot a running proxy serves
    (``GET /debug/explain`` with the config API token)."""
    if args.cluster_scope is not None:
        print("tunnelgate: explain --admin uses the running proxy's --cluster-scope",
              file=sys.stderr)
        return 2
    params = [("host", args.host), ("path", args.path), ("query", args.query),
              ("method", args.method)]
    if args.entrance is not None:  # else the proxy's own (see LiveState.explain)
        params.append(("entrance", args.entrance))
    params += [("header", h) for h in args.header]
    url = args.admin.rstrip("/") + "/debug/explain?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url)
    try:
        token = _admin_token(args.auth_token_file)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10.0) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()
        print(f"tunnelgate: {args.admin}: {exc.code} {detail}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"tunnelgate: {args.admin}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(answer["lines"]))
    return 0


def _admin_token(path: str | None) -> str | None:
    """The config API token: ``--auth-token-file``, else ``$PROXY_AUTH_TOKEN``."""
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    return os.environ.get("PROXY_AUTH_TOKEN", "").strip() or None


def _cmd_demo(args: argparse.Namespace) -> int:
    if not _start_logging(args):
        return 2
    try:
        settings = demo.demo_settings(os.environ)
    except SettingsError as exc:
        log.error(str(exc))
        return exc.exit_code
    _log_start()
    return run(demo.main(serve, settings))


def _cmd_cloudflared_config(args: argparse.Namespace) -> int:
    try:
        print(sidecar.render_ingress(args.hostname, args.service or sidecar.DEFAULT_SERVICE),
              end="")
    except ValueError as exc:
        print(f"tunnelgate: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_cloudflared_config(
        commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The ``cloudflared-config`` command and its flags."""
    ingress = commands.add_parser("cloudflared-config",
                                  help="print a cloudflared ingress for the sidecar")
    ingress.add_argument(
        "--hostname", action="append", default=[], metavar="HOST",
        help="a public hostname to route to the tunnel, listed in the output's comment "
             "(repeatable; RFC 1123, a wildcard only as a leading '*.', no port; "
             "cluster-local names such as NAME.NAMESPACE.svc.cluster.local are refused: "
             "never publish them)")
    ingress.add_argument("--service", metavar="URL",
                         help="where cloudflared sends traffic (default "
                              "http://127.0.0.1:8082)")
    ingress.set_defaults(run=_cmd_cloudflared_config)


def _add_explain(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The ``explain`` command and its flags."""
    explain = commands.add_parser("explain", help="show how a request would be routed")
    explain.add_argument("file", nargs="?", help="wire JSON or HTTPRoute YAML")
    explain.add_argument("--admin", metavar="URL",
                         help="ask a running proxy's config API instead of reading FILE "
                              "(token: --auth-token-file or $PROXY_AUTH_TOKEN)")
    explain.add_argument("--auth-token-file", metavar="FILE",
                         help="config API bearer token for --admin")
    add_backend_argument(explain)
    explain.add_argument("--host", required=True)
    explain.add_argument("--path", required=True)
    explain.add_argument("--query", default="", help="raw query string, without '?'")
    explain.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    explain.add_argument("--method", default="GET")
    explain.add_argument("--entrance", choices=ENTRANCES,
                         help="the entrance the request arrives by (default: with --admin, "
                              "the proxy's own, the tunnel's if it has one; with FILE, "
                              "any, unless a rule names entrances, then tunnel)")
    explain.add_argument("--cluster-scope", choices=SCOPES, default=None,
                         help="what the cluster entrance serves, as serve's flag (FILE "
                              "only; default all)")
    explain.set_defaults(run=_cmd_explain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunnelgate",
        description="Gateway API data plane for Cloudflare Tunnel and in-cluster traffic.")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the version and build, then exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("version", help="print the version and build (compiled or "
                                        "plain)").set_defaults(run=_cmd_version)

    serve_cmd = commands.add_parser("serve", help="run the proxy")
    add_serve_arguments(serve_cmd)
    serve_cmd.set_defaults(run=_cmd_serve)

    check = commands.add_parser(
        "check", help="validate a config, print its table and warnings")
    check.add_argument("file", help="wire JSON or HTTPRoute YAML, or a ConfigMap manifest "
                                    "holding either; - reads standard input")
    check.add_argument("--strict", action="store_true", help="exit 1 if there are warnings")
    add_backend_argument(check)
    check.set_defaults(run=_cmd_check)

    _add_explain(commands)

    convert_cmd = commands.add_parser("convert", help="print the wire JSON of a config file")
    convert_cmd.add_argument("file", help="HTTPRoute YAML (or wire JSON, normalised)")
    add_backend_argument(convert_cmd)
    convert_cmd.set_defaults(run=_cmd_convert)

    demo_cmd = commands.add_parser("demo", help="run two demo backends behind the proxy")
    demo_cmd.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    add_log_format_argument(demo_cmd.add_argument)
    demo_cmd.set_defaults(run=_cmd_demo)

    _add_cloudflared_config(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
        sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
    except BrokenPipeError:
        # The reader went away (``tunnelgate check big.json | head``): that is its
        # choice, not an error worth a traceback. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again, and exit as a process killed
        # by SIGPIPE would (128 + 13), like the shell tools this sits among.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
    return status
