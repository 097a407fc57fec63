"""Build script: the request hot path is compiled to C with mypyc.

The compiled modules are the same type-annotated Python sources, turned into C
extensions that sit next to them (``*.so``; an editable install builds them in place).
Calls between them become direct C calls and attribute reads become struct loads, which
cuts the proxy's own instructions per request nearly in half and its user CPU by about a
third (benchmarks/RESULTS.md). The sources stay the reference: with
``TUNNELGATE_PURE_PYTHON=1`` set at install time, when mypyc is missing or when the C
compiler fails, nothing is compiled and the same code runs interpreted, identically.

Only modules whose classes are never subclassed from interpreted code may be listed
(mypyc classes cannot be), and none whose frozen dataclasses are pickled to worker
processes (those live in ``proxy.control.settings``): a compiled frozen dataclass does not
unpickle.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Per-package groups: each becomes one shared library inside its own package, so the
# ``routing`` core never loads anything from ``proxy`` (it is sans-IO and imports no other
# package), and ``tunnel`` only what it imports.
NATIVE = {
    "routing": ["backend_tls", "compiled", "config", "decide", "fields", "filterkinds",
                "filters/cors", "filters/headers", "filters/kind", "filters/mirror",
                "filters/paths", "filters/redirect", "filters/rewrite", "jsonscan",
                "matchers", "model", "node", "pause", "rebuild", "regex", "reuse", "table",
                "tabletext", "validate", "values", "weights", "wire"],
    "proxy": ["request",
              "exchange/snapshot",
              "entrances/admission", "entrances/body", "entrances/connection",
              "entrances/cycle", "entrances/h2fields", "entrances/h2guard", "entrances/h2output",
              "entrances/h2server", "entrances/h2sniff", "entrances/h2stream",
              "entrances/http1", "entrances/listener",
              "entrances/output",
              "entrances/policy", "entrances/proxyproto",
              "exchange/awaited", "exchange/failures", "exchange/forward",
              "exchange/forwarding", "exchange/handler", "exchange/mirror", "exchange/reporting",
              "exchange/shedding", "exchange/steps",
              "exchange/websocket",
              "flow/buffer", "flow/clock", "flow/control", "flow/push", "flow/stream", "flow/turn",
              "observability/accesslog", "observability/children",
              "observability/configmetrics", "observability/hostseries", "observability/metrics",
              "upstream/base", "upstream/cap", "upstream/dial", "upstream/machine",
              "upstream/h2c", "upstream/h2link", "upstream/h2stream",
              "upstream/liveness", "upstream/outlier",
              "upstream/http1",
              "upstream/pool", "upstream/readbuffer", "upstream/reader", "upstream/registry",
              "upstream/request",
              "upstream/response", "upstream/sender", "upstream/unread",
              "wire/collect", "wire/framing", "wire/h2frames", "wire/head", "wire/meter",
              "wire/request", "wire/scan", "wire/server"],
    # The in-process bridge: cloudflared's side of an origin request, every request.
    "tunnel": ["headers", "origin", "sidecar", "writers"],
}


# Hand-written C for the few loops mypyc cannot make cheap; each stands in for a Python
# function that stays the reference and runs when the extension is not there.
HAND_WRITTEN = {"proxy.wire._headjoin": "proxy/wire/_headjoin.c",
                "proxy.wire._scan": "proxy/wire/_scan.c",
                "proxy.upstream._unread": "proxy/upstream/_unread.c"}


def native_extensions() -> list:  # type: ignore[type-arg]
    """mypyc's extensions for :data:`NATIVE` and :data:`HAND_WRITTEN`'s, or none
    (pure Python)."""
    if os.environ.get("TUNNELGATE_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    groups = [([f"{package}/{name}.py" for name in names], f"{package}._native")
              for package, names in NATIVE.items()]
    files = [path for paths, _ in groups for path in paths]
    compiled = mypycify(["--ignore-missing-imports", *files], opt_level="3",
                        separate=groups)
    return compiled + [Extension(name, [source], extra_compile_args=["-O2"])
                       for name, source in HAND_WRITTEN.items()]


class OptionalNativeBuild(build_ext):
    """Compiles on every core, and falls back to pure Python when it cannot compile
    (no C compiler or Python headers): the proxy must still install and run."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # distutils' compile/link errors share no base class
            print(f"tunnelgate: hot path not compiled ({exc}); running as pure Python",
                  file=sys.stderr)
            return
        if self.inplace:
            self._mark_current()

    def _mark_current(self) -> None:
        """An incremental build skips an extension whose generated C did not change
        (an edit to a comment or a docstring), which leaves it older than the edited
        source; ``proxy.control.native.stale_extensions`` would then call it stale. The
        build has just checked that every extension matches its sources, so say so."""
        for extension in self.extensions:
            path = self.get_ext_fullpath(extension.name)
            if os.path.exists(path):
                os.utime(path)


setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalNativeBuild})
