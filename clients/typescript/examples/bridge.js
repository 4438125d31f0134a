// A chat bridge on its cursor: every notification posted at least once, in seq order; the
// cursor advances only after a page is posted, so a crash hands that page over again.
import { Client } from "@tidemark/client";

const client = new Client(process.env.TIDEMARK_URL ?? "http://127.0.0.1:7700", process.env.TIDEMARK_TOKEN);
const stop = new AbortController();
process.on("SIGINT", () => stop.abort());

await client.consumer("chat-bridge", "notifications").run(async (page) => {
  for (const ev of page) console.log("posted", ev.seq, ev.subject);
}, { signal: stop.signal });
