// A dashboard that resumes its stream: after any failure it reconnects with Last-Event-ID and
// shows each event once, in order.
import { Client } from "@tidemark/client";

const client = new Client(process.env.TIDEMARK_URL ?? "http://127.0.0.1:7700", process.env.TIDEMARK_TOKEN);
const stop = new AbortController();
process.on("SIGINT", () => stop.abort());

for await (const ev of client.stream(0, { stream: "notifications", signal: stop.signal })) {
  console.log("shown", ev.seq, ev.type);
}
