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
