//! End-to-end tests: each test starts its own `tidemark serve` (port 0, own data dir) through
//! the harness in `tidemark_tests`, and checks the HTTP/SSE/CLI contract of
//! `docs/http-contract.md` and the invariants of the spec (I1–I9) from the outside: the log,
//! the tasks and notifications read models, the notification router (also across `kill -9`),
//! projection rebuild/verify, the delivery runtime (routing policies, claims and leases with
//! 32 concurrent claimers, lease expiry across `kill -9`, backpressure) and the bridge terminal
//! notifier (the decision table, cursors, pull and webhook sinks, at-least-once across
//! `kill -9`).
//!
//! A fresh server's log is not empty: it starts with the `settings.updated` event the server
//! records at start, so tests count seqs from [`tidemark_tests::Server::start_head`]. Routed
//! lifecycle types (`task.run_completed`, ...) make the router append `notification.created`
//! events asynchronously; tests that check exact heads use free-form types, the others wait
//! (bounded) for the router with `common::wait_routed`. Urgent and action notifications also
//! make the delivery scheduler append `delivery.created` asynchronously.
//!
//! Build the binary first: `cargo build -p tidemark-api`.

mod common;
mod e2e_admission;
mod e2e_alerts;
mod e2e_api_fuzz;
mod e2e_append;
mod e2e_auth;
mod e2e_backup;
mod e2e_bad_input;
mod e2e_bridge_sinks;
mod e2e_bridges;
mod e2e_campaign;
mod e2e_cli;
mod e2e_client;
mod e2e_cluster;
mod e2e_console;
mod e2e_crash;
mod e2e_deciders;
mod e2e_deliveries;
mod e2e_delivery_routing;
mod e2e_disk_full;
mod e2e_dispatch;
mod e2e_endpoints;
mod e2e_golden;
mod e2e_limits;
mod e2e_list_order;
mod e2e_logs;
mod e2e_model;
mod e2e_moves;
mod e2e_notification_status;
mod e2e_notifications;
mod e2e_operational;
mod e2e_operator;
mod e2e_ops;
mod e2e_ordering;
mod e2e_outbox_policies;
mod e2e_pace;
mod e2e_projections;
mod e2e_races;
mod e2e_read_models;
mod e2e_readme;
mod e2e_rebuild_crash;
mod e2e_receivers;
mod e2e_resume;
mod e2e_retention;
mod e2e_router_crash;
mod e2e_routes;
mod e2e_scopes;
mod e2e_settings;
mod e2e_shards;
mod e2e_shutdown;
mod e2e_sources;
mod e2e_task_stream;
mod e2e_tasks;
mod e2e_tenants;
mod e2e_tls;
mod e2e_truth;
