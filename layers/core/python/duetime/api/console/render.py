"""The console's HTML: Jinja2 templates (autoescaped), its security headers, CSRF tokens and small views.

- Every page goes out with :data:`SECURITY_HEADERS`: a Content-Security-Policy allowing scripts, styles,
  images and fetches from the console's own origin only (no inline script, no inline event handler, no
  ``eval``), no framing, no referrer to other origins.
- CSRF: a double-submit cookie. A page sets :data:`CSRF_COOKIE` (random, ``SameSite=Strict``, path
  ``/console``) when the request has none, and every form carries the same value in :data:`CSRF_FIELD`; a
  POST whose field does not match its cookie is refused (403) before anything changes (:func:`csrf_ok`).
  Another site can neither read the cookie nor make a browser send it (SameSite), so it cannot forge a form.
- Helpers the templates use: times in UTC and in a zone, a lag sparkline as inline SVG (no script), a job's
  next fires with notes on DST changes.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote
from zoneinfo import ZoneInfo

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.shared.cookies import Cookie, SameSite
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from duetime.domain.api_models import schedule_lag

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
#: the vendored htmx (npm htmx.org, its LICENSE beside it)
HTMX = "htmx-2.0.4.min.js"

CSRF_COOKIE = "duetime_csrf"
CSRF_FIELD = "csrf"
#: the signed-in tenant's bearer token (``/console/sign-in``): ``HttpOnly`` (no script reads it),
#: ``SameSite=Strict`` (no other site's request carries it), path ``/console`` (the JSON API never takes it)
SESSION_COOKIE = "duetime_session"
#: the longest token the sign-in form takes
MAX_TOKEN_CHARS = 2048

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

_env = Environment(
    loader=FileSystemLoader(str(TEMPLATES)),
    autoescape=select_autoescape(["html", "svg"], default_for_string=True, default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _utc(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "-"


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    """``value`` relative to ``now``: ``in 5 s``, ``3 min ago``."""
    if value is None:
        return ""
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    word = "ago" if seconds >= 0 else ""
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            text = f"{seconds / size:.0f} {unit}"
            break
    else:
        text = f"{seconds:.0f} s"
    return f"{text} {word}".strip() if word else f"in {text}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} s" if abs(value) < 10 else f"{value:.1f} s"


_env.filters.update(utc=_utc, ago=_ago, seconds=_seconds)
_env.globals.update(htmx=HTMX, csrf_field=CSRF_FIELD, lag_of=schedule_lag)


def render(template: str, **context: Any) -> str:
    """``template`` (a file under ``templates/``) rendered with ``context``; every value autoescaped."""
    return _env.get_template(template).render(**context)


def cookies_of(event: Mapping[str, Any]) -> dict[str, str]:
    """The request's cookies: HTTP API payload 2.0's ``cookies`` list, or a ``Cookie`` header."""
    jar: SimpleCookie = SimpleCookie()
    for raw in [*(event.get("cookies") or []), (event.get("headers") or {}).get("cookie", "")]:
        try:
            jar.load(raw)
        except Exception:  # noqa: BLE001 - a malformed cookie is no cookie
            continue
    return {name: morsel.value for name, morsel in jar.items()}


def csrf_token(event: Mapping[str, Any]) -> tuple[str, bool]:
    """The request's CSRF token and whether it is new (to be set as :data:`CSRF_COOKIE`)."""
    token = cookies_of(event).get(CSRF_COOKIE, "")
    if len(token) >= 32 and token.isalnum():
        return token, False
    return secrets.token_hex(32), True


def csrf_ok(event: Mapping[str, Any], form: Mapping[str, str]) -> bool:
    """A POST's form carries the token of its cookie (both present, equal: a double-submit check)."""
    cookie = cookies_of(event).get(CSRF_COOKIE, "")
    sent = form.get(CSRF_FIELD, "")
    return bool(cookie) and bool(sent) and hmac.compare_digest(cookie.encode(), sent.encode())


def html_response(
    body: str, *, status: int = 200, token: str | None = None, new_token: bool = False
) -> Response[str]:
    """An HTML answer with :data:`SECURITY_HEADERS`; ``new_token`` sets the CSRF cookie to ``token``."""
    headers: dict[str, str | list[str]] = dict(SECURITY_HEADERS)
    if new_token and token:
        headers["Set-Cookie"] = f"{CSRF_COOKIE}={token}; Path=/console; SameSite=Strict; HttpOnly"
    return Response(status_code=status, content_type="text/html; charset=utf-8", body=body, headers=headers)


def redirect(location: str, *, cookies: Sequence[Cookie] = ()) -> Response[str]:
    """303 See Other to ``location`` (a path of the console): the answer to a POST that did its work;
    ``cookies``: cookies to set with it."""
    return Response(
        status_code=303,
        body="",
        headers={**SECURITY_HEADERS, "Location": location},
        cookies=list(cookies),
    )


def session_cookie(token: str | None, *, secure: bool) -> Cookie:
    """The cookie keeping ``token`` (percent-encoded) as :data:`SESSION_COOKIE`, ``Secure`` when the
    request came over HTTPS; None: one that removes it."""
    return Cookie(
        SESSION_COOKIE,
        quote(token, safe="") if token is not None else "",
        path="/console",
        secure=secure,
        http_only=True,
        same_site=SameSite.STRICT_MODE,
        max_age=0 if token is None else None,
    )


def session_token(cookies: Mapping[str, str]) -> str | None:
    """The bearer token a :data:`SESSION_COOKIE` among ``cookies`` keeps (None without one)."""
    value = cookies.get(SESSION_COOKIE)
    return unquote(value) if value else None


# ---- views ---------------------------------------------------------------------------------------------
def sparkline(values: Sequence[float | None], *, width: int = 120, height: int = 24) -> Markup:
    """An inline SVG polyline of ``values`` (oldest first; None = a run that never started, skipped), scaled
    to the largest; an empty ``<svg>`` with a dash when there is nothing to draw. Numbers only go into the
    markup, so it needs no escaping; the label says the last value in words."""
    points = [v for v in values if v is not None]
    label = f"lag of the last {len(points)} runs, latest {points[-1]:.2f} s" if points else "no runs yet"
    if len(points) < 2:
        return Markup(
            f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="{label}">'
            f'<line x1="0" y1="{height - 2}" x2="{width}" y2="{height - 2}" class="spark-base"/></svg>'
        )
    top = max(max(points), 0.001)
    step = width / (len(points) - 1)
    coords = " ".join(
        f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(points)
    )
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="{label}">'
        f'<polyline points="{coords}" class="spark-line"/></svg>'
    )


def fires_with_dst_notes(fires: Sequence[datetime], zone_name: str, *, now: datetime) -> list[dict[str, Any]]:
    """Each fire (UTC) with its wall time in ``zone_name`` and, when the zone's UTC offset at the fire
    differs from the one before it (now, for the first), a note naming the change: the fire comes after a
    DST transition (``UTC+01:00 -> UTC+02:00``)."""
    zone = ZoneInfo(zone_name)
    out = []
    before = now.astimezone(zone).utcoffset() or timedelta(0)
    for fire in fires:
        local = fire.astimezone(zone)
        offset = local.utcoffset() or timedelta(0)
        note = None
        if offset != before:
            note = f"after a DST change: UTC{_offset(before)} -> UTC{_offset(offset)}"
        out.append({"utc": fire, "local": local.strftime("%Y-%m-%d %H:%M:%S %Z (UTC%z)"), "note": note})
        before = offset
    return out


def _offset(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON (for the edit form and result views)."""
    return json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False)
