"""JSON kept compressed with a shared dictionary: what the service holds of each of 10,000 Proxies.

A leader holds each Proxy's status twice (its board, and the status writer's last-written copy shared with
the cluster's copy the watch reads back) and each Proxy's declaration once (`PackedProxy`). Alone, a status of
about 800 bytes deflates to about 330: most of what is left is what every status repeats (field names,
condition types, reasons, messages), which deflate can take from a preset dictionary instead (RFC 1950's
FDICT; raw deflate here, no header or checksum: the bytes never leave the process). A `Packer`'s dictionary
is fixed for the life of the process: the same text always packs to the same bytes, so packed copies can
be compared for equality.
"""

from __future__ import annotations

import zlib

__all__ = ["PROXY_PACKER", "STATUS_PACKER", "Packer"]

_WBITS = -15  # raw deflate, 32 KiB window
# The smallest: level 9 takes a running proxy's status from 188 to 151 bytes as written and from 176 to 146
# as the board keeps it, for 11.6 us a pack against 8.6 at level 1 (a quiet machine, 2026-12-06); a status
# is packed again only after a change of it.
_LEVEL = 9


class Packer:
    """Packs bytes with a preset dictionary and unpacks them; `unpack(pack(b)) == b` for any `b`."""

    __slots__ = ("_zdict",)

    def __init__(self, zdict: bytes) -> None:
        self._zdict = zdict

    def pack(self, text: bytes) -> bytes:
        packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, 8, zlib.Z_DEFAULT_STRATEGY, self._zdict)
        return packer.compress(text) + packer.flush()

    def unpack(self, packed: bytes) -> bytes:
        unpacker = zlib.decompressobj(_WBITS, zdict=self._zdict)
        text = unpacker.decompress(packed) + unpacker.flush()
        if not unpacker.eof:
            raise ValueError("truncated packed text")
        return text


_T = "2026-12-01T00:00:00.000000Z"  # a condition's time, as the models write it (the digits differ)

# What every status repeats: field names, condition types, reasons and the service's fixed messages, as the
# board, the status writer and the cluster write them (camelCase). No value of any one fleet: a status's
# own values (its stack, host, times, a refusal's text) are packed as they come. The commonest last:
# deflate reaches the end of a dictionary with the shortest distances.
_STATUS_WORDS = (
    '"address":{"host":"","port":},"egressIP":"","stack":"","observedSpecHash":"","observedGeneration":'
    '"lastOperation":{"type":"up","type":"destroy","result":"in-progress","result":"failed",'
    '"result":"succeeded","startedAt":"","finishedAt":"","message":""},'
    '{"type":"Held","status":"True","status":"False","reason":"AsDeclared",'
    '"message":"the declared version is the one applied","lastTransitionTime":""},'
    '"reason":"InvalidSpec","reason":"Paused","reason":"InputChanged","reason":"NotProvisioned",'
    '{"type":"Stalled","status":"True","reason":"UnknownProvider",'
    '"message":"spec.provider: no provider named '
    "'' in the catalogue (known: ): fix the name or add an entry to the catalogue\","
    '"lastTransitionTime":""},'
    '{"type":"Healthy","status":"True","reason":"ProbeSucceeded","reason":"ProbeFailed","message":"",'
    '"lastTransitionTime":""},'
    '{"phase":"Ready","phase":"Stalled","phase":"Pending","phase":"Provisioning","conditions":['
    '{"type":"Provisioned","status":"False","reason":"Provisioned","message":"applied in stack ",'
    '"lastTransitionTime":"2026-12-04T16:00:00.000000Z"},'
    '{"type":"Stalled","status":"False","reason":"Reconciled","message":"",'
    '"lastTransitionTime":"2026-12-04T16:00:00.000000Z"},'
    # Whole statuses of the commonest kinds, with the values left out, in the two key orders they are
    # packed in. The board's (the model's field order; Ready is derived where shown, not kept):
    '{"phase":"Ready","conditions":[{"type":"Provisioned","status":"True","reason":"Provisioned",'
    '"message":"applied in stack ","lastTransitionTime":"' + _T + '"},'
    '{"type":"Stalled","status":"False","reason":"Reconciled","lastTransitionTime":"' + _T + '"},'
    '{"type":"Healthy","status":"True","reason":"ProbeSucceeded","message":"probe succeeded",'
    '"lastTransitionTime":"' + _T + '"}],"address":{"host":"","port":},"egressIP":"","observedSpecHash":"",'
    '"observedGeneration":1,"stack":"","lastOperation":{"type":"up","result":"succeeded",'
    '"startedAt":"' + _T + '","finishedAt":"' + _T + '"}}'
    # as the status writer writes them and the watch reads them back (keys sorted): not applied yet, and a
    # run in progress
    '{"conditions":[{"lastTransitionTime":"' + _T + '","message":"not applied yet","reason":"NotProvisioned",'
    '"status":"False","type":"Ready"}],"lastOperation":{"finishedAt":"' + _T + '","message":"",'
    '"result":"failed","startedAt":"' + _T + '","type":"up"},"phase":"Pending"}'
    '{"conditions":[{"lastTransitionTime":"' + _T + '","message":"a run of its stack is in progress",'
    '"reason":"Provisioning","status":"False","type":"Ready"}],"lastOperation":{"message":"",'
    '"result":"in-progress","startedAt":"' + _T + '","type":"up"},"phase":"Provisioning"}'
    # and the commonest of all, last: a proxy that runs and answers its probes (one copy, writer and watch)
    '{"address":{"host":"","port":},"conditions":[{"lastTransitionTime":"' + _T + '",'
    '"message":"applied in stack ","reason":"Provisioned","status":"True","type":"Provisioned"},'
    '{"lastTransitionTime":"' + _T + '","message":"","reason":"Reconciled","status":"False",'
    '"type":"Stalled"},{"lastTransitionTime":"' + _T + '","message":"probe succeeded",'
    '"reason":"ProbeSucceeded","status":"True","type":"Healthy"},{"lastTransitionTime":"' + _T + '",'
    '"message":"applied as declared and answering its probes (or not probed yet)","reason":"Ready",'
    '"status":"True","type":"Ready"}],"egressIP":"",'
    '"lastOperation":{"finishedAt":"' + _T + '","message":"","result":"succeeded","startedAt":"' + _T + '",'
    '"type":"up"},"observedGeneration":1,"observedSpecHash":"","phase":"Ready","stack":""}'
)

# What every declaration repeats (`PackedProxy`: the model's JSON, camelCase, as declared): field names.
_PROXY_WORDS = (
    '"labels":{},"pool":"","protocol":"http","protocol":"socks5","deletionTimestamp":"",'
    '"auth":{"mode":"generated","mode":"none","mode":"secret","secretRef":{"name":"","namespace":""}},'
    '"kubernetes":{},"gcp":{},"kvm":{},"local":{},'
    '"annotations":{"crawl.example.com/paused":"true","crawl.example.com/skip-cleanup":"true",'
    '"crawl.example.com/reconcile-requested-at":""},'
    '{"apiVersion":"crawl.example.com/v1alpha1","kind":"Proxy","metadata":{"name":"","namespace":"",'
    '"annotations":{},"uid":"","generation":1},"spec":{"provider":"","port":,"allowedSourceRanges":["'
    '/8","/16","/24","/32"],"egress":{"allowPorts":[],"allow":[{"cidr":"/32","ports":[]}]}}}'
)

STATUS_PACKER = Packer(_STATUS_WORDS.encode())
PROXY_PACKER = Packer(_PROXY_WORDS.encode())
