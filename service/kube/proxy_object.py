"""What the service keeps of each watched Proxy object: compact, decoded on each read.

The service watches 10,000 Proxies at once: each is kept as compact JSON text (a fifth of the size of the
dicts) holding only the fields the service uses, made as each listed page or watch event is read. The body's
text leaves out what the object keeps as fields anyway (apiVersion, kind, name, namespace, uid, generation)
and empty labels and annotations: they are put back when the body is decoded (320 -> 125 characters for a
plain Proxy: 1.8 MiB of a follower's 10,000). The status, a few fixed words and values (`_slim_status`), is
kept deflated with those words as a preset dictionary (224 characters -> 65 bytes for a Healthy one); its
stack and observed generation are kept apart too, so that a pass over the fleet reads them without inflating
10,000 statuses.
"""

from __future__ import annotations

import json
import sys
import zlib

from service.kube.watch import Obj
from stacks.compact import PROXY_PACKER
from stacks.models import API_VERSION, KIND
from stacks.models.conditions import ConditionType

FINALIZER = "crawl.example.com/cleanup"
PAUSED = "crawl.example.com/paused"
RECONCILE_REQUESTED = "crawl.example.com/reconcile-requested-at"
SKIP_CLEANUP = "crawl.example.com/skip-cleanup"

__all__ = [
    "FINALIZER",
    "PAUSED",
    "RECONCILE_REQUESTED",
    "SKIP_CLEANUP",
    "ProxyObject",
    "proxy_object",
    "slim_proxy",
]


class ProxyObject:
    """What the service keeps of one Proxy object: identity, the parts it reconciles, and its status.

    `body` (metadata: name, namespace, labels, annotations, uid, generation, deletionTimestamp; and spec) and
    `status` are kept as compact JSON text, deflated (each with a dictionary of its own), a tenth of the size
    of the dicts or less (the service watches 10,000 Proxies at once), and decoded on each read: every
    caller gets its own copy, the body equal to the one given after a JSON round trip (keys sorted). The
    body's text leaves out each identity field equal to the object's own (`_left_out` says which): compare
    bodies with `same_body`, not by their text. `stack` and `observed_generation` are the status's `stack`
    (interned) and `observedGeneration`, None when absent or not of the type the CRD gives them (string,
    integer).
    """

    __slots__ = (
        "_body",
        "_left_out",
        "_status",
        "bare",
        "deleting",
        "finalized",
        "generation",
        "key",
        "name",
        "namespace",
        "observed_generation",
        "resource_version",
        "stack",
        "uid",
    )

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        generation: int,
        resource_version: str,
        deleting: bool,
        finalized: bool,  # carries our finalizer
        body: Obj,
        status: Obj,
        bare: bool = False,  # carries no finalizer at all (ours is added without reading it again)
    ) -> None:
        self.namespace, self.name, self.uid = sys.intern(namespace), name, uid  # namespaces repeat
        # One string per Proxy, as Proxy.key (the cache's dict holds the same): made once, not on each read
        # (passes over 10,000 read it often).
        self.key = sys.intern(f"{namespace}/{name}")
        # The apiserver's versions are decimal numbers (opaque to clients: compared, never ordered): kept
        # as an int when the text is one's (28 bytes, the text 55), as given otherwise.
        self.generation, self.resource_version = generation, _version(resource_version)
        self.deleting, self.finalized, self.bare = deleting, finalized, bare
        self._body, self._left_out = _pack_body(body, self._identity())
        self._status = _deflate(_pack(status)) if status else b""
        stack, observed = status.get("stack"), status.get("observedGeneration")
        self.stack: str | None = sys.intern(stack) if type(stack) is str else None  # a few, 10,000 times
        self.observed_generation: int | None = observed if type(observed) is int else None

    @property
    def body(self) -> Obj:
        return _unpack_body(self._body, self._left_out, self._identity())

    @property
    def status(self) -> Obj:
        return dict(json.loads(_inflate(self._status))) if self._status else {}

    def same_body(self, other: ProxyObject) -> bool:
        """Whether `other`'s body is the same as this one's (its sorted JSON text: what the whole text
        compared before the body left parts out); decoded only when one left out what the other did not."""
        if self._left_out != other._left_out:
            return _pack(self.body) == _pack(other.body)
        return self._body == other._body and self._left_values() == other._left_values()

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.body["metadata"].get("annotations") or {})

    def same_reconciled_parts(self, other: ProxyObject) -> bool:
        """Whether a change to `other` touched nothing that matters to the control loop (our own status
        writes do not)."""
        return self.deleting == other.deleting and self.finalized == other.finalized and self.same_body(other)

    def _identity(self) -> tuple[str, str, str, int]:
        return (self.name, self.namespace, self.uid, self.generation)

    def _left_values(self) -> tuple[object, ...]:
        """The values of the identity fields its body left out (the rest left out are constants)."""
        return tuple(v for bit, v in zip(_METADATA, self._identity(), strict=True) if self._left_out & bit)

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProxyObject):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the dataclass it replaced

    def __repr__(self) -> str:
        return f"ProxyObject({self.key}, rv={self.resource_version}, deleting={self.deleting})"


def _version(text: str) -> int | str:
    """`text` as an int when it is one's decimal text (`str` of the int gives it back), else itself."""
    if text.isascii() and text.isdigit():
        number = int(text)
        if str(number) == text:
            return number
    return text


def _pack(obj: Obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


# The words of a status as `_slim_status` keeps it, a Healthy condition's usual values last (nearest): a
# preset dictionary for its deflated text. Changing it changes no meaning, only sizes (each process packs
# and unpacks with its own). Raw deflate (no header or checksum: the text never leaves the process), level 1,
# memLevel 1 and a 1 KiB window (wbits 10: a match reaches back 760 bytes, into the dictionary; at 9 it
# reaches 250): cheap to set up for 200-odd bytes.
_STATUS_WORDS = (
    b'"observedGeneration":"reason":"ProbeFailed","status":"False","type":"Healthy"}'
    b'{"address":{"host":"","port":},"conditions":[{"lastTransitionTime":"20","message":"",'
    b'"reason":"ProbeSucceeded","status":"True","type":"Healthy"}],"egressIP":"","stack":"'
)
_WBITS, _MEM_LEVEL = -10, 1


def _deflate(text: str) -> bytes:
    packer = zlib.compressobj(1, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, _STATUS_WORDS)
    return packer.compress(text.encode()) + packer.flush()


def _inflate(packed: bytes) -> str:
    unpacker = zlib.decompressobj(_WBITS, zdict=_STATUS_WORDS)
    return (unpacker.decompress(packed) + unpacker.flush()).decode()


# What a body's text may leave out, one bit each (all under 256: Python shares those ints).
_TYPE = 1  # apiVersion and kind, both this CRD's
_NAME, _NAMESPACE, _UID, _GENERATION = 2, 4, 8, 16  # metadata's: equal to the object's (and str, int)
_METADATA = (_NAME, _NAMESPACE, _UID, _GENERATION)
_IDENTITY = ("name", "namespace", "uid", "generation")
_LABELS, _ANNOTATIONS = 32, 64  # empty
_EMPTY = 128  # metadata itself, empty once the above are left out


def _pack_body(body: Obj, identity: tuple[str, str, str, int]) -> tuple[bytes, int]:
    """The body's compact JSON text without what the object keeps as fields, deflated with the
    declarations' dictionary (stacks/compact.py: about 180 -> 85 bytes for a plain Proxy; the same text
    always packs to the same bytes, so packed bodies compare as their texts do), and which parts it left
    out."""
    kept, left_out = dict(body), 0
    if _is(kept.get("apiVersion"), API_VERSION) and _is(kept.get("kind"), KIND):
        del kept["apiVersion"], kept["kind"]
        left_out |= _TYPE
    meta = kept.get("metadata")
    if type(meta) is dict:
        meta = dict(meta)
        for bit, key, value in zip(_METADATA, _IDENTITY, identity, strict=True):
            if key in meta and _is(meta[key], value):
                del meta[key]
                left_out |= bit
        for bit, key in ((_LABELS, "labels"), (_ANNOTATIONS, "annotations")):
            if type(meta.get(key)) is dict and not meta[key]:
                del meta[key]
                left_out |= bit
        if meta:
            kept["metadata"] = meta
        else:
            del kept["metadata"]
            left_out |= _EMPTY
    return PROXY_PACKER.pack(_pack(kept).encode()), left_out


def _is(value: object, kept: object) -> bool:
    """Equal and of the same type (no bool for an int: JSON tells them apart)."""
    return type(value) is type(kept) and value == kept


def _unpack_body(packed: bytes, left_out: int, identity: tuple[str, str, str, int]) -> Obj:
    """The body `_pack_body` was given, after a JSON round trip: the parts left out put back, keys sorted
    (unrolled: a body is decoded on every read, each time before a model validates it)."""
    body: Obj = json.loads(PROXY_PACKER.unpack(packed))
    if not left_out:
        return body
    if left_out & _TYPE:
        body["apiVersion"], body["kind"] = API_VERSION, KIND
    if left_out & ~_TYPE:
        meta: Obj = {} if left_out & _EMPTY else body["metadata"]
        name, namespace, uid, generation = identity
        if left_out & _NAME:
            meta["name"] = name
        if left_out & _NAMESPACE:
            meta["namespace"] = namespace
        if left_out & _UID:
            meta["uid"] = uid
        if left_out & _GENERATION:
            meta["generation"] = generation
        if left_out & _LABELS:
            meta["labels"] = {}
        if left_out & _ANNOTATIONS:
            meta["annotations"] = {}
        body["metadata"] = dict(sorted(meta.items()))
    return dict(sorted(body.items()))


def slim_proxy(obj: Obj) -> Obj:
    """The fields the service uses; managedFields, unrelated annotations and the rest are dropped."""
    meta = obj.get("metadata") or {}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("crawl.example.com/")
    }
    kept = {
        k: meta[k]
        for k in (
            "name",
            "namespace",
            "uid",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
            "finalizers",
        )
        if k in meta
    }
    kept["labels"] = meta.get("labels") or {}
    kept["annotations"] = annotations
    return {"metadata": kept, "spec": obj.get("spec") or {}, "status": _slim_status(obj.get("status") or {})}


def _slim_status(status: Obj) -> Obj:
    """What a follower serves from and a new leader continues from: where it serves, its stack and egress
    address, the generation its status describes (a new leader takes the changed ones in first), and the
    Healthy condition (the rest is the leader's own, in its board)."""
    kept: Obj = {k: status[k] for k in ("address", "stack", "egressIP", "observedGeneration") if k in status}
    healthy = [c for c in status.get("conditions") or [] if c.get("type") == ConditionType.HEALTHY]
    if healthy:
        kept["conditions"] = healthy
    return kept


def proxy_object(raw: Obj) -> ProxyObject:
    """What the watch keeps of a listed or watched Proxy, made as each page or event is read: a list of
    10,000 kept as dicts until the last page left the heap fragmented for good (in-process: +36 MiB against
    +13 MiB when each object is made compact at once)."""
    obj = slim_proxy(raw)
    meta = obj["metadata"]
    body_meta = {k: v for k, v in meta.items() if k not in ("resourceVersion", "finalizers")}
    return ProxyObject(
        namespace=meta.get("namespace") or "default",
        name=sys.intern(meta["name"]),  # the inventory's endpoint holds the same string
        uid=meta.get("uid") or "",
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        finalized=FINALIZER in (meta.get("finalizers") or []),
        bare=not meta.get("finalizers"),
        body={"apiVersion": API_VERSION, "kind": KIND, "metadata": body_meta, "spec": obj["spec"]},
        status=obj.get("status") or {},
    )
