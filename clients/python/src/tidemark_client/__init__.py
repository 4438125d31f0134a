"""The tidemark client (spec section 19): typed calls over HTTP and the loops every program
that talks to tidemark otherwise writes by hand.

>>> from tidemark_client import Client
>>> client = Client("http://127.0.0.1:7700")            # doctest: +SKIP
>>> for ev in client.stream(after_sequence=0):           # doctest: +SKIP
...     print(ev["seq"], ev["type"])
"""

from . import models
from ._errors import ApiError, TidemarkError, TransportError
from ._sync import Client, Consumer, Worker
from ._async import AsyncClient, AsyncConsumer, AsyncWorker
from ._common import Done, Failed
from .webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncWorker",
    "Client",
    "Consumer",
    "Done",
    "Failed",
    "TidemarkError",
    "TransportError",
    "WebhookVerificationError",
    "Worker",
    "models",
    "verify_webhook",
]
