"""edgeattn window get|set|lock|unlock: the live attention window of a running server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import click

from edgeattn.errors import InputError, RuntimeBackendError

TOKEN_VARIABLE = "EDGEATTN_SERVE_ADMIN_TOKEN"  # the variable `edgeattn serve` reads its token from


def server_options(command):
    command = click.option("--admin-token", envvar=TOKEN_VARIABLE, default=None, metavar="TOKEN",
                           help=f"The server's admin token, if it has one [default: {TOKEN_VARIABLE}].")(command)
    return click.option("--url", default="http://127.0.0.1:8000", show_default=True,
                        help="The server's base URL.")(command)


def _call(url: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method="GET" if data is None else "POST",
                                     headers=headers)
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
@server_options
@click.option("--json", "as_json", is_flag=True, help="Print the server's JSON answer (with history).")
def get(url, admin_token, as_json):
    """Print the current window and whether it is locked."""
    state = _call(url, "/v2/admin/window", token=admin_token)
    click.echo(json.dumps(state)) if as_json else _show(state)


@window.command("set")
@click.argument("value", type=int)
@server_options
@click.option("--reason", default="", help="Recorded in the window's history.")
def set_(value, url, admin_token, reason):
    """Set the window to VALUE (refused while locked)."""
    _show(_call(url, "/v2/admin/window", {"window": value, "reason": reason}, admin_token))


@window.command("lock")
@click.argument("value", type=int, required=False)
@server_options
def lock(value, url, admin_token):
    """Pin the window (at VALUE if given): the thermal controller's changes are ignored until unlock."""
    _show(_call(url, "/v2/admin/window/lock", {} if value is None else {"window": value}, admin_token))


@window.command("unlock")
@server_options
def unlock(url, admin_token):
    """Let the thermal controller change the window again."""
    _show(_call(url, "/v2/admin/window/unlock", {}, admin_token))
