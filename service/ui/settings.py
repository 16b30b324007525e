"""Settings of the fleet page (`PROXY_OPERATOR_UI_<FIELD>`); documented in docs/operations.md."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class UiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PROXY_OPERATOR_UI_", extra="forbid")

    enabled: bool = Field(True, description="Serve the fleet page at the root path.")
    root_path: str = Field(
        "",
        pattern=r"^(/[A-Za-z0-9._~-]+)*$",
        description="The prefix the page's links carry when a reverse proxy serves it under one, e.g. /ops.",
    )
    cookie_secure: bool = Field(
        False, description="Mark the session cookie Secure (set it when people reach the page over HTTPS)."
    )
    session_key_file: Path | None = Field(
        None,
        description="File holding the key that signs page sessions (a mounted Secret, the same on every "
        "replica); else one generated once into state_dir/ui-session-key.",
    )
    session_hours: float = Field(
        8.0, gt=0, le=24 * 30, description="A page session ends this long after log in."
    )
    login_attempts: int = Field(
        10, ge=1, le=1000, description="Log in attempts one source address may make per minute (more: 429)."
    )
    page_size: int = Field(50, ge=10, le=500, description="Proxies per page of the fleet view.")
