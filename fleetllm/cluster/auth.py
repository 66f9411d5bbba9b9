"""Ray token authentication, carried rather than turned off.

How the installed Ray (2.60) handles it, read from its source:

- `ray start --head` turns token mode on when `RAY_AUTH_MODE=token` is set, or when the mode is unset
  and a token already exists (`ray._private.authentication.authentication_token_setup.
  maybe_enable_token_auth_if_token_available`). A local `ray.init()` turns it on by default and writes
  `~/.ray/auth_token` when there is none.
- A joining node (`ray start --address`) and a driver only send the token when `RAY_AUTH_MODE=token`
  is in their environment (a driver also switches it on when the mode is unset and a token is found).
- The token is looked up, in order, in `$RAY_AUTH_TOKEN`, the file named by `$RAY_AUTH_TOKEN_PATH`,
  and `~/.ray/auth_token`. The dashboard's HTTP API (and so job submission) wants it as
  `Authorization: Bearer <token>`.

fleetllm therefore always starts and joins with `RAY_AUTH_MODE=token` and an explicit
`RAY_AUTH_TOKEN`, generating one (through `ray get-auth-token --generate`) only when a head is
started and no token exists anywhere. It never sets the mode to `disabled`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fleetllm.errors import FleetError

AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


class AuthError(FleetError):
    """No Ray authentication token could be found or made."""


@dataclass(frozen=True)
class Token:
    """A Ray authentication token and where it came from (for messages; never print the value)."""

    value: str
    source: str


def default_token_path() -> Path:
    """Ray's default token file, `~/.ray/auth_token`."""
    return Path.home() / ".ray" / "auth_token"


def find_token(explicit: str | None = None, env: dict[str, str] | None = None) -> Token | None:
    """The token to use: `explicit` (the --token flag), then $RAY_AUTH_TOKEN, then the file in
    $RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token; None when there is none."""
    env = os.environ if env is None else env
    if explicit:
        return Token(explicit.strip(), "--token")
    if env.get(TOKEN_ENV, "").strip():
        return Token(env[TOKEN_ENV].strip(), f"${TOKEN_ENV}")
    candidates = []
    if env.get(TOKEN_PATH_ENV):
        candidates.append((Path(env[TOKEN_PATH_ENV]).expanduser(), f"${TOKEN_PATH_ENV}"))
    candidates.append((default_token_path(), str(default_token_path())))
    for path, source in candidates:
        if path.is_file():
            value = path.read_text().strip()
            if value:
                return Token(value, source)
    return None


def require_token(explicit: str | None = None, *, for_what: str) -> Token:
    """Like find_token, but a missing token is an error that says where to get one."""
    token = find_token(explicit)
    if token is None:
        raise AuthError(
            f"{for_what} needs the cluster's Ray authentication token and none was found "
            f"(looked at --token, ${TOKEN_ENV}, ${TOKEN_PATH_ENV} and {default_token_path()}); "
            "copy ~/.ray/auth_token from the head node (or run `ray get-auth-token` there) and pass it "
            f"with --token or ${TOKEN_ENV}"
        )
    return token


def ensure_head_token(explicit: str | None = None) -> Token:
    """The token a new head starts with; generates ~/.ray/auth_token with Ray's own command when
    there is none at all."""
    token = find_token(explicit)
    if token is not None:
        return token
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = [str(ray_cli) if ray_cli.exists() else "ray", "get-auth-token", "--generate"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AuthError(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")
    token = find_token()
    if token is None:
        raise AuthError(f"`{' '.join(cmd)}` ran but {default_token_path()} holds no token")
    return token


def auth_env(token: Token) -> dict[str, str]:
    """Environment variables that make a Ray process (raylet, driver, CLI) use the token."""
    return {AUTH_MODE_ENV: "token", TOKEN_ENV: token.value}


def auth_headers(token: Token | None) -> dict[str, str]:
    """HTTP headers for the dashboard API (job submission, logs)."""
    return {"Authorization": f"Bearer {token.value}"} if token else {}


def apply_to_process(token: Token) -> None:
    """Make this process a token-authenticated Ray driver (before or after `import ray`)."""
    os.environ.update(auth_env(token))
    ray = sys.modules.get("ray")
    if ray is not None and not ray.is_initialized():
        try:  # Ray caches its config and token; refresh both (as Ray's own _enable_token_auth does).
            from ray._raylet import AuthenticationTokenLoader, Config

            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()
        except (ImportError, AttributeError):  # pragma: no cover - other Ray versions
            pass
