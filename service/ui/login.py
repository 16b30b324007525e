"""Log in and out of the page, and the checks every page request passes: same-site only, a live session.

The form POSTs one field, `token`; the body guard lets this one path through without a bearer token, at
1 KiB (`LOGIN_BODY_LIMIT`), and the route counts tries per source address before reading it.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.ui.context import UiContext
from service.ui.html import PAGE_HEADERS, esc, href, page
from service.ui.session import COOKIE, Session

LOGIN_PATH = "/login"
LOGIN_BODY_LIMIT = 1024
router = APIRouter(include_in_schema=False)


def ui_of(request: Request) -> UiContext:
    ui: UiContext = request.app.state.ui
    return ui


def cross_site(request: Request) -> bool:
    """A request another site made the browser send: Sec-Fetch-Site says so, or an Origin that is not ours."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if request.method != "GET" and origin is not None:
        return urlsplit(origin).netloc != request.headers.get("host", "")
    return False


def refused() -> HTMLResponse:
    return HTMLResponse("cross-site requests to this page are refused", status_code=403)


def from_another_site(request: Request) -> Response | None:
    """The answer to a request another site made, None for our own. A person following a shared link (a
    top-level GET navigation) gets a page that continues to the same address from here, so the Strict
    cookie goes along; anything else (a form post, a frame, an image, a fetch) is refused."""
    if not cross_site(request):
        return None
    navigating = request.headers.get("sec-fetch-mode") == "navigate"
    if request.method == "GET" and navigating and request.headers.get("sec-fetch-dest") == "document":
        target = esc(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        ui = ui_of(request)
        body = f'<p><a href="{esc(ui.settings.root_path)}{target}">Continue to the page</a></p>'
        text = page(root=ui.settings.root_path, title="Continue", body=body, who=None, refresh=False)
        text = text.replace(
            "<head>",
            f'<head><meta http-equiv="refresh" content="0;url={esc(ui.settings.root_path)}{target}">',
            1,
        )
        return HTMLResponse(text, headers=PAGE_HEADERS)
    return refused()


async def session_of(request: Request) -> Session | None:
    return await ui_of(request).sessions.check(request.cookies.get(COOKIE))


def to_login(request: Request) -> RedirectResponse:
    root = ui_of(request).settings.root_path
    return RedirectResponse(root + LOGIN_PATH, status_code=303)


def _form(root: str, *, problem: str = "") -> str:
    alert = f'<p role="alert" class="bad">{esc(problem)}</p>' if problem else ""
    body = (
        f'{alert}<form method="post" action="{href(root, LOGIN_PATH)}">'
        '<p><label for="token">Token (a <code>view</code> or <code>admin</code> scope)</label><br>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required '
        'size="40" maxlength="512" autofocus></p><p><button type="submit">Log in</button></p></form>'
        '<p class="mute">The page keeps a session cookie, never the token.</p>'
    )
    return page(root=root, title="Log in", body=body, who=None, refresh=False)


@router.get(LOGIN_PATH, response_class=HTMLResponse)
async def login_form(request: Request) -> Response:
    other = from_another_site(request)
    if other is not None:
        return other
    return HTMLResponse(_form(ui_of(request).settings.root_path), headers=PAGE_HEADERS)


@router.post(LOGIN_PATH, response_class=HTMLResponse)
async def login(request: Request) -> Response:
    ui = ui_of(request)
    root = ui.settings.root_path
    if cross_site(request):
        return refused()
    source = request.client.host if request.client else "?"
    wait = ui.limiter.allow(source)
    if wait is not None:
        text = _form(root, problem=f"too many tries from {source}: wait {wait:.0f} s")
        headers = {"Retry-After": str(max(1, round(wait))), **PAGE_HEADERS}
        return HTMLResponse(text, status_code=429, headers=headers)
    fields = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (fields.get("token") or [""])[0].strip()
    started = ui.sessions.start(token) if token else None
    if started is None:
        problem = _form(root, problem="unknown token, or no view scope")
        return HTMLResponse(problem, status_code=401, headers=PAGE_HEADERS)
    cookie, session = started
    answer = RedirectResponse(root + "/", status_code=303)
    answer.set_cookie(
        COOKIE,
        cookie,
        max_age=int(session.expires_at - ui.sessions.clock()),
        path=root or "/",
        secure=ui.settings.cookie_secure,
        httponly=True,
        samesite="strict",
    )
    return answer


@router.post("/logout")
async def logout(request: Request) -> Response:
    ui = ui_of(request)
    if cross_site(request):
        return refused()
    session = await session_of(request)
    if session is not None:
        await ui.sessions.end(session)
    answer = to_login(request)
    answer.delete_cookie(
        COOKIE,
        path=ui.settings.root_path or "/",
        secure=ui.settings.cookie_secure,
        httponly=True,
        samesite="strict",
    )
    return answer
