"""Which client headers each entrance may believe.

Two entrances share one table and one Handler; what each may *serve* is routing's
(:mod:`routing.decide`). What each may *believe* is decided here, before routing:

- ``tunnel`` — only cloudflared reaches it (loopback / unix socket); its trust rules
  live in ``tunnel/sidecar.py``.
- ``cluster`` — the pod-IP listener other pods and Knative's prober dial, and
  ``cluster-tls``, the same over TLS (its own name, so that rules can be served on
  one and not the other, as Gateway API's HTTP and HTTPS listeners are). Anything in
  the cluster can reach them, bypassing Cloudflare Access and WAF, so they believe no
  header only Cloudflare's edge may set (:func:`cluster_prepare`).
"""

from __future__ import annotations

from proxy.request import Request


def cluster_prepare(request: Request) -> None:
    """Trust rules of the cluster entrance, run before routing.

    Edge headers (``CF-Connecting-IP``, ``CF-Visitor``, ``Cf-Access-*``,
    ``cf-cloudflared-*`` …) only mean something when Cloudflare's edge set them; a pod
    dialing us directly could forge them to impersonate an edge-authenticated client,
    so every ``cf-*`` request header is dropped here.
    """
    headers = request.headers
    for name, _ in headers:  # a plain loop: this runs on every cluster request
        if is_edge_header(name):
            request.headers = [pair for pair in headers if not is_edge_header(pair[0])]
            return


def is_edge_header(name: bytes) -> bool:
    """``name`` starts with ``cf-`` or ``cf_`` in any case (CGI-style servers read
    ``Cf_Connecting_Ip`` as ``CF-Connecting-IP``). Byte by byte, with no slice or
    lowered copy: it is asked of every header of every cluster request (``| 0x20``
    lowers an ASCII letter and maps no other byte onto ``c`` or ``f``)."""
    return len(name) >= 3 and (name[2] == 45 or name[2] == 95) \
        and (name[0] | 0x20) == 99 and (name[1] | 0x20) == 102
