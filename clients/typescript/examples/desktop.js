// A desktop claimer: claims the app sink's deliveries, shows each, reports it done; a lease is
// extended while a notification is on screen.
import { Client, done } from "@tidemark/client";

const client = new Client(process.env.TIDEMARK_URL ?? "http://127.0.0.1:7700", process.env.TIDEMARK_TOKEN);
const stop = new AbortController();
process.on("SIGINT", () => stop.abort());

await client.worker("app", "ana-laptop").run(async (delivery) => {
  console.log("shown on desktop", delivery.notification_id);
  return done();
}, { signal: stop.signal });
