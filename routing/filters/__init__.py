"""One module per Gateway API filter type: its payload's reader and wire form, its
HTTPRoute YAML translation where that differs, what the table compiles it into, and the
arithmetic of what it does to a request or a response (``proxy.exchange.steps`` applies
it). Each module defines its :class:`~routing.filters.kind.FilterKind`; the registry,
:data:`routing.filterkinds.KINDS`, lists them, one line each."""
