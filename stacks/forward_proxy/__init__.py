"""The forward proxy that the `local` provider runs: HTTP (plain and CONNECT) or SOCKS5, with egress policy.

pproxy, which ran local proxies before, cannot filter destinations. This one resolves the destination
itself, judges every resolved address with `stacks.egress.decide`, and connects only to an address it
allowed (never resolving twice, so DNS rebinding cannot slip between the check and the connect). A refusal is
recognisably the proxy's: `403` with `Proxy-Status: proxy-operator; error=destination_ip_prohibited`
(RFC 9209) for HTTP and CONNECT, reply 0x02 ("not allowed by ruleset") for SOCKS5. A site that is down gets a
`502` (or `504`) with its own `Proxy-Status` error instead of a closed connection.

A token can hurt only itself: a connection that logged in as a lease user ends with that user (revoked, or
past its end: `tethers.py`), and no client can hold the proxy's descriptors without authenticating or
while silent (a deadline for the request head and the SOCKS5 handshake, an idle limit on relays, caps per
source address and in all: `config.Limits`, `occupancy.py`).

Run as `python -m stacks.forward_proxy CONFIG.json` (`config.py` says what the file holds).
"""
