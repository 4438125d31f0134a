"""What a call can fail with: the server's problem, typed by its stable ``code``, or the
transport (no answer: the request may or may not have landed)."""

from __future__ import annotations

from typing import Any, Optional


class TidemarkError(Exception):
    """Any failure of a call."""

    retryable: bool = False


class ApiError(TidemarkError):
    """The server answered with a problem (``application/problem+json``)."""

    def __init__(self, status: int, problem: dict[str, Any], retry_after: Optional[float]):
        self.status = status
        self.problem = problem
        self.code: str = problem.get("code") or f"http_{status}"
        self.detail: str = problem.get("detail") or ""
        self.field: Optional[str] = problem.get("field")
        self.retry_after = retry_after
        self.retryable = status >= 500 or status in (408, 429)
        super().__init__(f"{status} {self.code}: {self.detail}")


class TransportError(TidemarkError):
    """No answer: the connection failed or was lost."""

    retryable = True
