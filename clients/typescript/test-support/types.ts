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
  type models,
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
  const who: models.Identity = await client.ops.getWhoami();
  const open: boolean = who.open;
  // @ts-expect-error: the answer is typed, `open` is no string.
  const wrong: string = who.open;
  const put: models.RouteAnswer = await client.ops.putRoute("r", { route: { sink: "app" }, reason: "x" });
  const seq: number = put.as_of_seq;
  const page = await client.ops.listDeliveries({ status: "parked", limit: 10 });
  const claimed: models.DeliveriesPage = await client.ops.claimDeliveries({ sink: "app", owner: "w", limit: 5 });
  const kind: string | null | undefined = claimed.deliveries[0].type;
  // @ts-expect-error: a claim names its owner.
  await client.ops.claimDeliveries({ sink: "app" });
  const d: models.DeliveryAnswer = await client.ops.getDelivery(page.deliveries[0].id);
  const attempts: number = d.attempts + seq + (open ? 0 : 1) + wrong.length + (kind ? 1 : 0);
  await verifyWebhook(["k1", "k2"], new Headers(), new Uint8Array());
  try {
    await client.delivery("dlv:x:desktop");
  } catch (e) {
    if (e instanceof ApiError) return e.status + report.completed + attempts;
  }
  return first;
}
