"""`lease_json` (service/api/convert.py) writes the bytes pydantic writes of the `LeaseResponse` model,
for any text the inventory and the store hold: escapes, non-ASCII, control characters, lone surrogates
(for which it gives None, and the caller builds the models)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.api.convert import lease_json, leased
from service.api.models import LeaseResponse
from service.discovery.lease_users import LeaseUser
from service.discovery.store import LeaseRecord
from service.inventory import Health, HealthState
from tests.service.conftest import endpoint, healthy_inventory

text = st.text(max_size=12)  # any code point, lone surrogates included


@settings(max_examples=300, deadline=None)
@given(
    name=st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    username=st.none() | text,
    password=st.none() | text,
    pool=st.none() | text,
    provider=text,
    host=text.filter(bool),
    egress=st.none() | text,
    target=text,
    session=st.none() | text,
    user=st.none() | st.tuples(text, text),
    expires=st.floats(0, 4e9),
)
def test_lease_json_is_the_models_json(
    name: str,
    username: str | None,
    password: str | None,
    pool: str | None,
    provider: str,
    host: str,
    egress: str | None,
    target: str,
    session: str | None,
    user: tuple[str, str] | None,
    expires: float,
) -> None:
    inventory = healthy_inventory([])
    proxy = endpoint(name, username=username, password=password, pool=pool, provider=provider, host=host)
    inventory.replace_all([proxy])
    inventory.set_health(proxy.key, Health(state=HealthState.healthy, egress_ip=egress))
    lease = LeaseRecord(
        lease_id="l-1", client="c", target=target, proxy=proxy.key, handed_at=0.0, expires_at=expires
    )
    users = {} if user is None else {"l-1": LeaseUser(username=user[0], password=user[1])}
    answer: dict[str, object] = {
        "target": target,
        "session": session,
        "rebound": False,
        "previousProxy": None,
        "lowered": {},
    }
    written = lease_json([lease], users, inventory, answer=answer)
    item = leased(lease, endpoint=proxy, health=inventory.health(proxy.key), user=users.get("l-1"))
    model = LeaseResponse(leases=[item], target=target, session=session)
    texts = [username, password, pool, provider, host, egress, target, session, *(user or ())]
    if any(_surrogate(t) for t in texts if t is not None):
        assert written is None  # the caller builds the models (which write the surrogate as pydantic does)
        return
    assert written == model.model_dump_json(by_alias=True).encode()


def _surrogate(value: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
