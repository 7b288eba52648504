"""netpolicy: HTTP-aware network policy (endpoint grammar, DNS, HTTP filter, audit).

Pure policy plus a proxy; it never imports sandlock.
"""
