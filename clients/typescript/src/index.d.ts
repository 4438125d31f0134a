// Types of @tidemark/client (src/index.js).

import type { Operations } from "./operations.js";
export type { Operations };
/** The API's JSON as types, one per schema of the document (generated: `models.d.ts`). */
export type * as models from "./models.js";

export interface NewEvent {
  event_id?: string;
  stream: string;
  subject: string;
  type: string;
  payload: Record<string, unknown>;
}

export interface Event {
  seq: number;
  event_id: string;
  stream: string;
  subject: string;
  type: string;
  /** Commit time, RFC 3339 UTC. */
  time: string;
  payload: Record<string, unknown>;
}

export interface AppendReceipt {
  events: { event_id: string; seq: number; duplicate: boolean }[];
  last_seq: number;
}

export interface EventsPage {
  events: Event[];
  next_after_sequence: number;
  latest_event_seq: number;
}

export interface Cursor {
  consumer_id: string;
  stream_name: string;
  subject_id: string;
  last_sequence: number;
  last_delivery_id: string | null;
}

export interface Delivery {
  id: string;
  notification_id: string;
  route: string;
  sink: string;
  status: string;
  attempts: number;
  type?: string;
  [key: string]: unknown;
}

export interface CompleteResult {
  id: string;
  status: number;
  delivery: Delivery | null;
  code: string | null;
  detail: string | null;
}

export interface Failure {
  code: string;
  message?: string;
  retryable?: boolean;
  retryAfterMs?: number;
}

export type Outcome = { failed: false } | ({ failed: true } & Failure);

export interface WorkerReport {
  completed: number;
  failed: number;
  released: number;
  refused: number;
}

export class ApiError extends Error {
  status: number;
  code: string;
  detail: string;
  field?: string;
  retryAfterMs?: number;
  retryable: boolean;
  problem: Record<string, unknown>;
}

export class TransportError extends Error {
  retryable: true;
}

export class WebhookVerificationError extends Error {}

export function uuid7(): string;

export class Client {
  constructor(baseUrl: string, token?: string, options?: { attempts?: number; maxRetryAfterMs?: number });
  readonly baseUrl: string;
  /** Every JSON operation of the API, one call each (generated from the OpenAPI document). */
  readonly ops: Operations;
  /** The same server acting for tenant `name`: every call under `/tenants/{name}`, same token. */
  tenant(name: string): Client;
  append(events: NewEvent[]): Promise<AppendReceipt>;
  events(afterSequence?: number, options?: { stream?: string; subject?: string; limit?: number }): Promise<EventsPage>;
  stream(
    afterSequence?: number,
    options?: { stream?: string; subject?: string; type?: string; signal?: AbortSignal },
  ): AsyncGenerator<Event, void, undefined>;
  cursor(consumerId: string, streamName: string, subjectId?: string): Promise<Cursor>;
  advanceCursor(
    consumerId: string,
    streamName: string,
    lastSequence: number,
    deliveryId: string,
    options?: { subjectId?: string; expectedSequence?: number },
  ): Promise<Cursor>;
  claim(sink: string, owner: string, limit?: number, leaseMs?: number): Promise<Delivery[]>;
  complete(owner: string, ids: string[]): Promise<CompleteResult[]>;
  fail(id: string, owner: string, failure: Failure): Promise<Delivery>;
  extend(id: string, owner: string, leaseMs: number): Promise<Delivery>;
  delivery(id: string): Promise<Delivery>;
  consumer(consumerId: string, streamName: string, options?: { subjectId?: string; page?: number; idleMs?: number }): Consumer;
  worker(sink: string, owner: string, options?: { limit?: number; leaseMs?: number; idleMs?: number }): Worker;
}

export class Consumer {
  run(handler: (events: Event[]) => unknown | Promise<unknown>, options?: { signal?: AbortSignal }): Promise<number>;
}

export class Worker {
  run(handler: (d: Delivery) => Outcome | Promise<Outcome>, options?: { signal?: AbortSignal }): Promise<WorkerReport>;
}

export function done(): Outcome;
export function failed(code: string, message?: string, options?: { retryable?: boolean; retryAfterMs?: number }): Outcome;
export function sign(secret: string, id: string, timestamp: number, body: string | Uint8Array): Promise<string>;
export function verifyWebhook(
  secret: string | string[],
  headers: Headers | Record<string, string>,
  body: string | Uint8Array,
  options?: { nowS?: number; toleranceS?: number },
): Promise<void>;
