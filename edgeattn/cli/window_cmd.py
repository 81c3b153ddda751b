"""edgeattn window get|set|lock|unlock: the live attention window of a running server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import click

from edgeattn.errors import InputError, RuntimeBackendError

url_option = click.option("--url", default="http://127.0.0.1:8000", show_default=True,
                          help="The server's base URL.")


def _call(url: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method="GET" if data is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise InputError(f"{url}: {message} (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeBackendError(f"cannot reach the server at {url}: {exc}") from None


def _show(state: dict) -> None:
    window = state["window"]
    click.echo(f"window {window}{' (full attention)' if window == 0 else ''}"
               f"{', locked' if state['locked'] else ''}")


@click.group()
def window():
    """Show or change the attention window of a running `edgeattn serve` (0 = full attention)."""


@window.command("get")
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print the server's JSON answer (with history).")
def get(url, as_json):
    """Print the current window and whether it is locked."""
    state = _call(url, "/v2/admin/window")
    click.echo(json.dumps(state)) if as_json else _show(state)


@window.command("set")
@click.argument("value", type=int)
@url_option
@click.option("--reason", default="", help="Recorded in the window's history.")
def set_(value, url, reason):
    """Set the window to VALUE (refused while locked)."""
    _show(_call(url, "/v2/admin/window", {"window": value, "reason": reason}))


@window.command("lock")
@click.argument("value", type=int, required=False)
@url_option
def lock(value, url):
    """Pin the window (at VALUE if given): the thermal controller's changes are ignored until unlock."""
    _show(_call(url, "/v2/admin/window/lock", {} if value is None else {"window": value}))


@window.command("unlock")
@url_option
def unlock(url):
    """Let the thermal controller change the window again."""
    _show(_call(url, "/v2/admin/window/unlock", {}))
