# A dashboard that resumes its stream: after any failure it reconnects with Last-Event-ID and
# shows each event once, in order.
import os

from tidemark_client import Client

client = Client(os.environ.get("TIDEMARK_URL", "http://127.0.0.1:7700"), os.environ.get("TIDEMARK_TOKEN"))
try:
    for ev in client.stream(after_sequence=0, stream="notifications"):
        print("shown", ev["seq"], ev["type"], flush=True)
except KeyboardInterrupt:
    pass
