"""Structured logs: one line per record, with the fields (stack, proxy, operation, ...) that code attaches."""

from __future__ import annotations

import json
import logging
import sys


class FieldsFormatter(logging.Formatter):
    """`time level logger message key=value ...`, or one JSON object per line with json=True."""

    def __init__(self, *, as_json: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in (getattr(record, "fields", None) or {}).items() if v is not None}
        if self.as_json:
            body = {
                "time": self.formatTime(record),
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
                **fields,
            }
            # Tracebacks are what an incident needs most; `json.dumps` escapes their newlines, so the
            # record stays one line.
            if record.exc_info:
                body["exc_info"] = self.formatException(record.exc_info)
            elif record.exc_text:
                body["exc_info"] = record.exc_text
            if record.stack_info:
                body["stack_info"] = self.formatStack(record.stack_info)
            return json.dumps(body, default=str)
        text = super().format(record)
        return text + "".join(f" {k}={v}" for k, v in fields.items() if f"{v}" not in record.getMessage())


def configure_logging(*, level: str = "INFO", as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FieldsFormatter(as_json=as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


# What a probe of the service fetches: at 10,000 proxies probed every 10 s the echo route alone is 1,000
# requests a second, and an access-log line each was most of what the service's event loop wrote.
PROBE_PATHS = ("/v1/echo", "/healthz", "/readyz", "/metrics")


class QuietProbes(logging.Filter):
    """Drops uvicorn's access-log line of the probes' requests: any `/v1/echo` (the health probes fetch it
    through every proxy), and `/healthz`, `/readyz` and `/metrics` when they answered below 400."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 5:
            return True  # not uvicorn's access line (client, method, path, version, status)
        path, status = str(args[2]).split("?", 1)[0], args[4]
        if path == PROBE_PATHS[0]:
            return False
        return not (path in PROBE_PATHS and isinstance(status, int) and status < 400)


_QUIET = QuietProbes()


def access_log(mode: str) -> bool:
    """Set uvicorn's access log up for `mode` (all, api, off); returns whether uvicorn should log access."""
    logger = logging.getLogger("uvicorn.access")
    if mode == "api":
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)
    else:
        logger.removeFilter(_QUIET)
    return mode != "off"
