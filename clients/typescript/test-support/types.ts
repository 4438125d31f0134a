// The declarations (src/index.d.ts, src/operations.d.ts) checked by `tsc --noEmit`: a
// program written against them, the way the README's examples use the client, compiles.
import {
  ApiError,
  Client,
  done,
  failed,
  verifyWebhook,
  type Delivery,
  type Event,
  type Outcome,
} from "@tidemark/client";

export async function uses(): Promise<number> {
  const client = new Client("http://127.0.0.1:7700", undefined);
  const receipt = await client.append([{ stream: "s", subject: "a", type: "t", payload: { i: 1 } }]);
  const first: number = receipt.events[0].seq;
  const stop = new AbortController();
  for await (const ev of client.stream(0, { stream: "notifications", signal: stop.signal })) {
    const e: Event = ev;
    if (e.seq > first) break;
  }
  await client.consumer("chat-bridge", "notifications").run(async (page: Event[]) => {
    page.forEach((e) => e.subject.toUpperCase());
  }, { signal: stop.signal });
  const report = await client.worker("app", "ana-laptop", { limit: 5 }).run(async (d: Delivery): Promise<Outcome> =>
    d.notification_id ? done() : failed("desktop_busy", "locked", { retryable: true }), { signal: stop.signal });
  const who = await client.ops.getWhoami();
  await client.ops.putRoute("r", { route: { sink: "app" }, reason: "x" });
  await client.ops.listDeliveries({ status: "parked", limit: 10 });
  await verifyWebhook(["k1", "k2"], new Headers(), new Uint8Array());
  try {
    await client.delivery("dlv:x:desktop");
  } catch (e) {
    if (e instanceof ApiError) return e.status + report.completed + (who ? 0 : 1);
  }
  return first;
}
