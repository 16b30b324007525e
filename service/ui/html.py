"""The page shell and the few HTML helpers the views share: escaped text, links under the root path, tables.

Plain strings, no template engine and no front-end code besides one small inline script (pausable
auto-refresh). Every value from the service goes through `esc`.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from urllib.parse import urlencode

NAV = (
    ("Fleet", "/"),
    ("Pools", "/pools"),
    ("Stacks", "/stacks"),
    ("Deletions", "/deletions"),
    ("Lease API", "/leases"),
)

CSS = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--mute:#57606a;--line:#d0d7de;--bad:#a40e26;
--warn:#7a4d00;--ok:#116329;--link:#0550ae;--chip:#f6f8fa}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mute:#9ea7b3;--line:#30363d;
--bad:#ff8182;--warn:#e3b341;--ok:#56d364;--link:#79c0ff;--chip:#161b22}}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,sans-serif;background:var(--bg);color:var(--fg)}
a{color:var(--link)}a:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible{
outline:2px solid var(--link);outline-offset:2px}
header{display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center;padding:.5rem 1rem;
border-bottom:1px solid var(--line)}
header nav ul{display:flex;flex-wrap:wrap;gap:1rem;list-style:none;margin:0;
padding:0}header .who{margin-left:auto;color:var(--mute)}main{padding:0 1rem 2rem}
h1{font-size:1.25rem;margin:1rem 0 .5rem}h2{font-size:1.05rem;margin:1.25rem 0 .5rem}
.wrap{overflow-x:auto}table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid var(--line);vertical-align:top}th{font-weight:600;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums}.mute{color:var(--mute)}
.bad{color:var(--bad)}.warn{color:var(--warn)}.ok{color:var(--ok)}
.phase{display:inline-block;padding:0 .4rem;border:1px solid currentColor;border-radius:.6rem;font-size:.85em}
form.filters{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:end;margin:.5rem 0}
form.filters label{display:flex;flex-direction:column;font-size:.85em;color:var(--mute)}
input,select,button{font:inherit;color:var(--fg);background:var(--chip);border:1px solid var(--line);
border-radius:4px;padding:.25rem .4rem}button{cursor:pointer}
code,pre{font-family:ui-monospace,monospace;font-size:.9em;background:var(--chip);padding:0 .2rem}
pre{padding:.5rem;overflow-x:auto}.pager{display:flex;gap:1rem;margin:.5rem 0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem}dl.facts dt{color:var(--mute)}
dl.facts dd{margin:0;min-width:0;overflow-wrap:anywhere}
.refresh{display:flex;gap:.5rem;align-items:center;color:var(--mute)}

@media (max-width:700px){
table,tbody,tr,td,caption{display:block}caption{text-align:left}thead{position:absolute;left:-9999px}
tr{border-bottom:2px solid var(--line);padding:.3rem 0}td{border:0;padding:.15rem .25rem}
td::before{content:attr(data-label) ": ";color:var(--mute)}}
"""

REFRESH = """
(function(){var key='po-refresh-paused',box=document.getElementById('pause'),left=15,
out=document.getElementById('countdown');if(!box)return;box.checked=localStorage.getItem(key)==='1';
box.addEventListener('change',function(){localStorage.setItem(key,box.checked?'1':'0')});
setInterval(function(){if(box.checked){out.textContent='paused';return}left-=1;
out.textContent='in '+left+' s';if(left<=0){location.reload()}},1000)})();
"""


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Only this page's own style and script run, nothing is framed, forms post only here.
CSP = (
    f"default-src 'none'; style-src {_digest(CSS)}; script-src {_digest(REFRESH)}; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": CSP,
}


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def href(root: str, path: str, query: Mapping[str, str] | None = None) -> str:
    wanted = {k: v for k, v in (query or {}).items() if v}
    return esc(root + path + (("?" + urlencode(wanted)) if wanted else ""))


def when(at: datetime | float | None, *, now: float | None = None) -> str:
    """An absolute UTC time in a <time> element, with how long ago (or how soon) for a reader."""
    if at is None:
        return '<span class="mute">-</span>'
    moment = at if isinstance(at, datetime) else datetime.fromtimestamp(at, tz=UTC)
    delta = moment.timestamp() - (now if now is not None else datetime.now(UTC).timestamp())
    text = ago(delta)
    return f'<time datetime="{esc(moment.isoformat())}" title="{esc(moment.isoformat())}">{esc(text)}</time>'


def ago(delta: float) -> str:
    span = abs(delta)
    unit = (
        f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min" if span < 7200 else f"{span / 3600:.1f} h"
    )
    return f"in {unit}" if delta > 0 else f"{unit} ago"


def table(headers: Iterable[str | tuple[str, str]], rows: Iterable[Iterable[str]], *, caption: str) -> str:
    """A table of already-escaped cells; a header given as (text, class) carries the class to its column."""
    heads = [(h, "") if isinstance(h, str) else h for h in headers]
    head = "".join(f'<th scope="col" class="{cls}">{text}</th>' for text, cls in heads)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{heads[i][1]}" data-label="{heads[i][0]}">{cell}</td>' for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    if not body:
        body = f'<tr><td colspan="{len(heads)}" class="mute">nothing to show</td></tr>'
    return (
        f'<div class="wrap"><table><caption class="mute">{esc(caption)}</caption><thead><tr>{head}</tr>'
        f"</thead><tbody>{body}</tbody></table></div>"
    )


def page(*, root: str, title: str, body: str, who: str | None, note: str = "", refresh: bool = True) -> str:
    links = "".join(f'<li><a href="{href(root, path)}">{esc(name)}</a></li>' for name, path in NAV)
    user = ""
    if who is not None:
        user = (
            f'<form class="who" method="post" action="{href(root, "/logout")}">signed in as '
            f'<strong>{esc(who)}</strong> <button type="submit">Log out</button></form>'
        )
    control = ""
    if refresh:
        control = (
            '<div class="refresh"><label><input type="checkbox" id="pause"> pause auto-refresh</label>'
            f'<span id="countdown" aria-live="off">in 15 s</span></div><script>{REFRESH}</script>'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)} · proxy-operator</title><style>{CSS}</style></head><body>"
        "<header><strong>proxy-operator</strong>"
        f'<nav aria-label="Views"><ul>{links}</ul></nav>{user}</header>'
        f"<main><h1>{esc(title)}</h1>{note}{body}{control}</main></body></html>"
    )
