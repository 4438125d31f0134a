# A desktop claimer: claims the app sink's deliveries, shows each, reports it done; a lease is
# extended while a notification is on screen.
import os

from tidemark_client import Client, Done

client = Client(os.environ.get("TIDEMARK_URL", "http://127.0.0.1:7700"), os.environ.get("TIDEMARK_TOKEN"))


def show(delivery):
    print("shown on desktop", delivery["notification_id"], flush=True)
    return Done()


try:
    client.worker("app", owner="ana-laptop").run(show)
except KeyboardInterrupt:
    pass
