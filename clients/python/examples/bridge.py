# A chat bridge on its cursor: every notification posted at least once, in seq order; the
# cursor advances only after a page is posted, so a crash hands that page over again.
import os

from tidemark_client import Client

client = Client(os.environ.get("TIDEMARK_URL", "http://127.0.0.1:7700"), os.environ.get("TIDEMARK_TOKEN"))


def post_to_chat(page):
    for ev in page:
        print("posted", ev["seq"], ev["subject"], flush=True)


try:
    client.consumer("chat-bridge", "notifications").run(post_to_chat)
except KeyboardInterrupt:
    pass
