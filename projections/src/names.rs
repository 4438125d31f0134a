//! The names tidemark gives things, each written once, as a type: the reserved streams and
//! event types (spec section 2), delivery statuses (section 5), and the deterministic ids the
//! server derives (routed notifications, deliveries, bridge cursors and deliveries, mismatch
//! records). Code compares and builds through these; the strings appear nowhere else.

use std::fmt;

/// An enum of names with `as_str`, `parse` and `ALL`. It is never equal to a string: text
/// from outside is parsed first (`parse`), so a misspelt name cannot compile as a comparison.
/// What every enum of names is: a closed set of names, each stored and served as itself.
/// Code generic over it (a request body's field, an OpenAPI enum) reads them here.
pub trait Name: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// Every name, in declaration order.
    const ALL: &'static [Self];
    /// The name as it appears in events and on the wire.
    fn as_str(self) -> &'static str;
    /// The name for `s`, if `s` is one.
    fn parse(s: &str) -> Option<Self>;

    /// Every name, comma-separated (for error messages).
    fn joined() -> String {
        Self::ALL
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

macro_rules! names {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $v,)* }

        impl $name {
            /// Every name, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];

            /// The name as it appears in events and on the wire.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }

            /// Every name, comma-separated (for error messages).
            pub fn joined() -> String {
                <$name as Name>::joined()
            }

            /// The name for `s`, if `s` is one.
            pub fn parse(s: &str) -> Option<$name> {
                match s { $($s => Some($name::$v),)* _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String { n.as_str().to_owned() }
        }

        impl Name for $name {
            const ALL: &'static [$name] = $name::ALL;

            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }

            fn parse(s: &str) -> Option<$name> {
                $name::parse(s)
            }
        }

        /// Stored and served as its name: the same bytes as the string it replaced (postcard
        /// and JSON alike), so rows written before it read back.
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{s:?} is not one of {}",
                        $name::joined()
                    ))
                })
            }
        }
    };
}

names! {
    /// The streams tidemark reserves.
    Stream {
        TaskEvents = "task_events",
        Notifications = "notifications",
        Recipients = "recipients",
        Deliveries = "deliveries",
        Cursors = "cursors",
        Bridges = "bridges",
        Settings = "settings",
        Sources = "sources",
        Retention = "retention",
        /// Admissions to the outbox on a cluster (spec section 16: one subject all nodes'
        /// admissions write and append on the condition of, so `max_pending` holds across them).
        Outbox = "outbox",
        /// Notification lists (section 17), subject the list's name.
        Lists = "lists",
        /// Routes managed at runtime (section 4), subject the route's name.
        Routes = "routes",
        /// The health and circuit of each delivering route (section 17), subject the route's
        /// name.
        Endpoints = "endpoints",
        /// What one node met that an operator must know (section 17: free space near and at
        /// its reserve, poisoned models), subject the node's id.
        Nodes = "nodes",
        /// The deployment's tenants and where each lives (section 20), subject the tenant's
        /// name; the default tenant's alone (the directory).
        Tenants = "tenants",
    }
}

names! {
    /// Every event type tidemark defines (spec section 2). Types under these prefixes that are
    /// not listed here are refused; other types are free-form.
    EventType {
        TaskCreated = "task.created",
        TaskRunStarted = "task.run_started",
        TaskRunCompleted = "task.run_completed",
        TaskRunFailed = "task.run_failed",
        TaskRunCanceled = "task.run_canceled",
        TaskRunReviewRequested = "task.run_review_requested",
        TaskRunReviewApproved = "task.run_review_approved",
        TaskRunReviewRejected = "task.run_review_rejected",
        TaskCanceled = "task.canceled",
        NotificationRequested = "notification.requested",
        NotificationCreated = "notification.created",
        NotificationCanceled = "notification.canceled",
        NotificationTerminalStateMismatch = "notification.terminal_state_mismatch",
        RecipientUpdated = "recipient.updated",
        RecipientSuppressed = "recipient.suppressed",
        RecipientUnsuppressed = "recipient.unsuppressed",
        DeliveryCreated = "delivery.created",
        DeliveryLeased = "delivery.leased",
        DeliverySent = "delivery.sent",
        DeliveryAttemptFailed = "delivery.attempt_failed",
        DeliveryLeaseExpired = "delivery.lease_expired",
        DeliverySkipped = "delivery.skipped",
        DeliveryCancelled = "delivery.cancelled",
        DeliveryRetried = "delivery.retried",
        DeliveryResent = "delivery.resent",
        DeliveryDiscarded = "delivery.discarded",
        DeliveryLeaseExtended = "delivery.lease_extended",
        DeliveryJoined = "delivery.joined",
        DeliveryDeferred = "delivery.deferred",
        CursorAdvanced = "cursor.advanced",
        CursorReset = "cursor.reset",
        CursorFailed = "cursor.failed",
        BridgeSubscribed = "bridge.subscribed",
        BridgeUnsubscribed = "bridge.unsubscribed",
        SettingsUpdated = "settings.updated",
        SourceItem = "source.item",
        SourceWatermarkAdvanced = "source.watermark_advanced",
        SourcePaused = "source.paused",
        SourceResumed = "source.resumed",
        SourceReset = "source.reset",
        SourceParked = "source.parked",
        SourceItemSkipped = "source.item_skipped",
        RetentionPurged = "retention.purged",
        OutboxAdmitted = "outbox.admitted",
        ListUpdated = "list.updated",
        ListDeleted = "list.deleted",
        RouteUpdated = "route.updated",
        RouteDeleted = "route.deleted",
        EndpointDisabled = "endpoint.disabled",
        EndpointEnabled = "endpoint.enabled",
        EndpointCircuitOpened = "endpoint.circuit_opened",
        EndpointCircuitProbed = "endpoint.circuit_probed",
        EndpointCircuitClosed = "endpoint.circuit_closed",
        EndpointUnresolved = "endpoint.unresolved",
        EndpointResolved = "endpoint.resolved",
        NodeSpaceLow = "node.space_low",
        NodeSpaceReserveReached = "node.space_reserve_reached",
        NodeSpaceRecovered = "node.space_recovered",
        NodeModelsPoisoned = "node.models_poisoned",
        TenantCreated = "tenant.created",
        TenantRemoved = "tenant.removed",
        TenantMoved = "tenant.moved",
        TenantGap = "tenant.gap",
        TenantFenced = "tenant.fenced",
    }
}

/// Prefixes whose types tidemark defines.
pub const RESERVED_PREFIXES: [&str; 15] = [
    "task.",
    "notification.",
    "recipient.",
    "delivery.",
    "cursor.",
    "bridge.",
    "settings.",
    "source.",
    "retention.",
    "outbox.",
    "list.",
    "route.",
    "endpoint.",
    "node.",
    "tenant.",
];

/// What every task lifecycle event type starts with.
pub const LIFECYCLE_PREFIX: &str = "task.";

impl EventType {
    /// An event's type when tidemark defines it and the event is on that type's own stream;
    /// `None` for a client's free-form type, a reserved one only a newer version writes, or
    /// one on another stream.
    pub fn of(ev: &tidemark_log::EventRef<'_>) -> Option<EventType> {
        EventType::parse(ev.event_type).filter(|t| Stream::parse(ev.stream) == Some(t.stream()))
    }

    /// The stream every event of this type is on (`notification.terminal_state_mismatch` is
    /// recorded in the task's `task_events`, where the bridge replays it).
    pub const fn stream(self) -> Stream {
        use EventType::*;
        match self {
            TaskCreated
            | TaskRunStarted
            | TaskRunCompleted
            | TaskRunFailed
            | TaskRunCanceled
            | TaskRunReviewRequested
            | TaskRunReviewApproved
            | TaskRunReviewRejected
            | TaskCanceled
            | NotificationTerminalStateMismatch => Stream::TaskEvents,
            NotificationRequested | NotificationCreated | NotificationCanceled => {
                Stream::Notifications
            }
            RecipientUpdated | RecipientSuppressed | RecipientUnsuppressed => Stream::Recipients,
            DeliveryCreated
            | DeliveryLeased
            | DeliverySent
            | DeliveryAttemptFailed
            | DeliveryLeaseExpired
            | DeliverySkipped
            | DeliveryCancelled
            | DeliveryRetried
            | DeliveryResent
            | DeliveryDiscarded
            | DeliveryLeaseExtended
            | DeliveryJoined
            | DeliveryDeferred => Stream::Deliveries,
            CursorAdvanced | CursorReset | CursorFailed => Stream::Cursors,
            BridgeSubscribed | BridgeUnsubscribed => Stream::Bridges,
            SettingsUpdated => Stream::Settings,
            SourceItem
            | SourceWatermarkAdvanced
            | SourcePaused
            | SourceResumed
            | SourceReset
            | SourceParked
            | SourceItemSkipped => Stream::Sources,
            RetentionPurged => Stream::Retention,
            OutboxAdmitted => Stream::Outbox,
            ListUpdated | ListDeleted => Stream::Lists,
            RouteUpdated | RouteDeleted => Stream::Routes,
            EndpointDisabled
            | EndpointEnabled
            | EndpointCircuitOpened
            | EndpointCircuitProbed
            | EndpointCircuitClosed
            | EndpointUnresolved
            | EndpointResolved => Stream::Endpoints,
            NodeSpaceLow | NodeSpaceReserveReached | NodeSpaceRecovered | NodeModelsPoisoned => {
                Stream::Nodes
            }
            TenantCreated | TenantRemoved | TenantMoved | TenantGap | TenantFenced => {
                Stream::Tenants
            }
        }
    }

    /// Written by tidemark only: a client may not append it.
    pub const fn server_only(self) -> bool {
        !matches!(
            self.stream(),
            Stream::TaskEvents | Stream::Notifications | Stream::Recipients
        ) || matches!(
            self,
            EventType::NotificationCreated | EventType::NotificationTerminalStateMismatch
        )
    }

    /// A task lifecycle event (`task.*`).
    pub fn is_lifecycle(self) -> bool {
        self.as_str().starts_with(LIFECYCLE_PREFIX)
    }

    /// What a `delivery.*` type does to the deliveries model; `None` for every other type.
    /// Every type is named here, so a new one must say what it is.
    pub const fn delivery_event(self) -> Option<DeliveryEvent> {
        use DeliveryTransition as D;
        use EventType::*;
        Some(match self {
            DeliveryCreated => DeliveryEvent::Created,
            DeliveryJoined => DeliveryEvent::Joined,
            DeliveryLeased => DeliveryEvent::Transition(D::Leased),
            DeliverySent => DeliveryEvent::Transition(D::Sent),
            DeliveryAttemptFailed => DeliveryEvent::Transition(D::AttemptFailed),
            DeliveryLeaseExpired => DeliveryEvent::Transition(D::LeaseExpired),
            DeliverySkipped => DeliveryEvent::Transition(D::Skipped),
            DeliveryCancelled => DeliveryEvent::Transition(D::Cancelled),
            DeliveryRetried => DeliveryEvent::Transition(D::Retried),
            DeliveryResent => DeliveryEvent::Transition(D::Resent),
            DeliveryDiscarded => DeliveryEvent::Transition(D::Discarded),
            DeliveryLeaseExtended => DeliveryEvent::Transition(D::LeaseExtended),
            DeliveryDeferred => DeliveryEvent::Transition(D::Deferred),
            TaskCreated
            | TaskRunStarted
            | TaskRunCompleted
            | TaskRunFailed
            | TaskRunCanceled
            | TaskRunReviewRequested
            | TaskRunReviewApproved
            | TaskRunReviewRejected
            | TaskCanceled
            | NotificationRequested
            | NotificationCreated
            | NotificationCanceled
            | NotificationTerminalStateMismatch
            | RecipientUpdated
            | RecipientSuppressed
            | RecipientUnsuppressed
            | CursorAdvanced
            | CursorReset
            | CursorFailed
            | BridgeSubscribed
            | BridgeUnsubscribed
            | SettingsUpdated
            | SourceItem
            | SourceWatermarkAdvanced
            | SourcePaused
            | SourceResumed
            | SourceReset
            | SourceParked
            | SourceItemSkipped
            | RetentionPurged
            | OutboxAdmitted
            | ListUpdated
            | ListDeleted
            | RouteUpdated
            | RouteDeleted
            | EndpointDisabled
            | EndpointEnabled
            | EndpointCircuitOpened
            | EndpointCircuitProbed
            | EndpointCircuitClosed
            | EndpointUnresolved
            | EndpointResolved
            | NodeSpaceLow
            | NodeSpaceReserveReached
            | NodeSpaceRecovered
            | NodeModelsPoisoned
            | TenantCreated
            | TenantRemoved
            | TenantMoved
            | TenantGap
            | TenantFenced => return None,
        })
    }
}

names! {
    /// The transitions of a delivery row (spec section 5): every `delivery.*` event type but
    /// `delivery.created` (which makes the row) and `delivery.joined` (which adds a
    /// notification to a digest), by the name the row's timeline records (the type without
    /// `delivery.`). Each carries a [`crate::deliveries::Change`];
    /// [`crate::deliveries::allowed`] says from which statuses, and
    /// [`crate::deliveries::transition`] applies it.
    DeliveryTransition {
        Leased = "leased",
        Sent = "sent",
        AttemptFailed = "attempt_failed",
        LeaseExpired = "lease_expired",
        Skipped = "skipped",
        Cancelled = "cancelled",
        Retried = "retried",
        /// An operator sends a sent delivery again (section 17): back to queued.
        Resent = "resent",
        Discarded = "discarded",
        LeaseExtended = "lease_extended",
        Deferred = "deferred",
    }
}

impl DeliveryTransition {
    /// The event type that records it.
    pub const fn event_type(self) -> EventType {
        use DeliveryTransition as D;
        match self {
            D::Leased => EventType::DeliveryLeased,
            D::Sent => EventType::DeliverySent,
            D::AttemptFailed => EventType::DeliveryAttemptFailed,
            D::LeaseExpired => EventType::DeliveryLeaseExpired,
            D::Skipped => EventType::DeliverySkipped,
            D::Cancelled => EventType::DeliveryCancelled,
            D::Retried => EventType::DeliveryRetried,
            D::Resent => EventType::DeliveryResent,
            D::Discarded => EventType::DeliveryDiscarded,
            D::LeaseExtended => EventType::DeliveryLeaseExtended,
            D::Deferred => EventType::DeliveryDeferred,
        }
    }
}

impl From<DeliveryTransition> for EventType {
    fn from(t: DeliveryTransition) -> EventType {
        t.event_type()
    }
}

/// What a `delivery.*` event does to the deliveries model ([`EventType::delivery_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryEvent {
    /// `delivery.created`: a new row.
    Created,
    /// `delivery.joined`: a notification joins a digest row.
    Joined,
    /// Any other: a transition of the row.
    Transition(DeliveryTransition),
}

impl DeliveryEvent {
    /// The name the row's timeline records: the event type without `delivery.`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryEvent::Created => "created",
            DeliveryEvent::Joined => "joined",
            DeliveryEvent::Transition(t) => t.as_str(),
        }
    }
}

names! {
    /// Notification priorities, most pressing first (spec section 4).
    Priority {
        Urgent = "urgent",
        Action = "action",
        Warning = "warning",
        Info = "info",
    }
}

names! {
    /// The statuses of a task (spec section 2).
    TaskStatus {
        Open = "open",
        Running = "running",
        AwaitingReview = "awaiting_review",
        Completed = "completed",
        Failed = "failed",
        Canceled = "canceled",
    }
}

names! {
    /// Where a route's deliveries go (spec sections 4 and 17): claimed by an app, or delivered
    /// by tidemark's dispatcher by email or webhook. A delivery row holds `Option<Sink>`: a
    /// skipped delivery (an unknown route, a route with no sink) is taken by no sink and is
    /// stored and served as `"none"` ([`sink_or_none`]).
    Sink {
        App = "app",
        Email = "email",
        Webhook = "webhook",
    }
}

/// A priority as an event payload carries it: one of [`Priority`], or [`Priority::Info`] for
/// any other value (an event the schema did not check: the folds never fail on an event; a
/// missing priority is `info` too). Rows store a checked `Priority`.
pub mod priority_or_info {
    use super::Priority;

    /// A payload's priority, `info` when it is missing or none of them.
    pub fn parse(s: Option<&str>) -> Priority {
        s.and_then(Priority::parse).unwrap_or(Priority::Info)
    }

    pub fn serialize<S: serde::Serializer>(p: &Priority, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(p.as_str())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Priority, D::Error> {
        let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        Ok(parse(Some(&s)))
    }
}

/// A delivery's sink as stored and served: the sink's name, or `"none"` for a delivery no sink
/// takes (the bytes the string field held before it was typed). For `#[serde(with)]`.
pub mod sink_or_none {
    use super::Sink;

    /// What a delivery with no sink is stored and served as.
    pub const NONE: &str = "none";

    /// The name of `sink`, or [`NONE`].
    pub const fn name(sink: Option<Sink>) -> &'static str {
        match sink {
            Some(s) => s.as_str(),
            None => NONE,
        }
    }

    /// `s` as a row's sink: a sink's name, or [`NONE`].
    pub fn parse(s: &str) -> Option<Option<Sink>> {
        if s == NONE {
            Some(None)
        } else {
            Sink::parse(s).map(Some)
        }
    }

    pub fn serialize<S: serde::Serializer>(sink: &Option<Sink>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name(*sink))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Sink>, D::Error> {
        let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("{s:?} is not one of {}, {NONE}", Sink::joined()))
        })
    }
}

names! {
    /// The statuses of a delivery (spec section 5).
    DeliveryStatus {
        Queued = "queued",
        Leased = "leased",
        RetryWait = "retry_wait",
        Sent = "sent",
        Parked = "parked",
        Discarded = "discarded",
        Skipped = "skipped",
        Cancelled = "cancelled",
    }
}

names! {
    /// How a bridge posts a subscription's events (spec section 6): in the thread, or as a
    /// new post. Stored and recorded as its name.
    BridgeMode {
        Reply = "reply",
        Post = "post",
    }
}

names! {
    /// The review state of a task's run (spec section 2).
    #[derive(Default)]
    ReviewState {
        #[default]
        None = "none",
        Pending = "pending",
        Approved = "approved",
        Rejected = "rejected",
    }
}

names! {
    /// What a source's poller is doing on this node (spec section 12): paused and parked come
    /// from the log; standby while another node of a cluster holds the poller's lease.
    #[derive(Default)]
    SourceState {
        #[default]
        Idle = "idle",
        Polling = "polling",
        BackingOff = "backing_off",
        Paused = "paused",
        Parked = "parked",
        Standby = "standby",
    }
}

impl DeliveryStatus {
    /// Not yet sent, skipped, cancelled or discarded, and not parked: the outbox still owes it.
    pub const PENDING: [DeliveryStatus; 3] = [
        DeliveryStatus::Queued,
        DeliveryStatus::Leased,
        DeliveryStatus::RetryWait,
    ];

    pub fn is_pending(self) -> bool {
        Self::PENDING.contains(&self)
    }
}

pub mod ids;

impl Sink {
    /// Whether tidemark delivers this sink itself (`email`, `webhook`): its routes have
    /// endpoints, with a health record and a circuit (section 17).
    pub const fn delivered_by_tidemark(self) -> bool {
        matches!(self, Sink::Email | Sink::Webhook)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delivery's sink is stored and served as the string it was before it was typed: the
    /// same postcard and JSON bytes, `"none"` for no sink; an unknown name is refused.
    #[test]
    fn a_rows_sink_keeps_the_strings_bytes() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Typed {
            #[serde(with = "sink_or_none")]
            sink: Option<Sink>,
        }
        #[derive(serde::Serialize)]
        struct Text {
            sink: &'static str,
        }
        for (typed, text) in [
            (Some(Sink::App), "app"),
            (Some(Sink::Email), "email"),
            (Some(Sink::Webhook), "webhook"),
            (None, "none"),
        ] {
            let t = Typed { sink: typed };
            let bytes = postcard::to_allocvec(&t).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&Text { sink: text }).unwrap());
            assert_eq!(postcard::from_bytes::<Typed>(&bytes).unwrap(), t);
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("{{\"sink\":\"{text}\"}}"));
            assert_eq!(serde_json::from_str::<Typed>(&json).unwrap(), t);
        }
        let e = serde_json::from_str::<Typed>(r#"{"sink":"pager"}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"pager\" is not one of app, email, webhook, none"),
            "{e}"
        );
    }

    #[test]
    fn names_round_trip_and_are_unique() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(*t));
            assert!(RESERVED_PREFIXES.iter().any(|p| t.as_str().starts_with(p)));
        }
        for s in Stream::ALL {
            assert_eq!(Stream::parse(s.as_str()), Some(*s));
        }
        for s in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::parse(s.as_str()), Some(*s));
        }
        for t in DeliveryTransition::ALL {
            assert_eq!(DeliveryTransition::parse(t.as_str()), Some(*t));
        }
        let mut all: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), EventType::ALL.len());
    }

    /// Clients write lifecycle events, notification requests and cancels and recipient updates;
    /// tidemark
    /// writes everything else (spec section 2).
    #[test]
    fn who_writes_what() {
        let client: Vec<&str> = EventType::ALL
            .iter()
            .filter(|t| !t.server_only())
            .map(|t| t.as_str())
            .collect();
        assert_eq!(
            client,
            [
                "task.created",
                "task.run_started",
                "task.run_completed",
                "task.run_failed",
                "task.run_canceled",
                "task.run_review_requested",
                "task.run_review_approved",
                "task.run_review_rejected",
                "task.canceled",
                "notification.requested",
                "notification.canceled",
                "recipient.updated",
                "recipient.suppressed",
                "recipient.unsuppressed",
            ]
        );
        // 50 server-only types: `endpoint.unresolved`, `endpoint.resolved` and
        // `source.item_skipped` came with issue 53, the four `node.*` with issue 56, the five
        // `tenant.*` with issue 58.
        assert_eq!(EventType::ALL.len() - client.len(), 50);
    }

    /// Every `delivery.*` type (and no other) says what it does to a delivery row, by the
    /// name its timeline has always recorded; every transition is one of them.
    #[test]
    fn delivery_events_are_the_delivery_types() {
        for t in EventType::ALL {
            let kind = t.as_str().strip_prefix("delivery.");
            assert_eq!(t.delivery_event().map(DeliveryEvent::as_str), kind, "{t}");
            assert_eq!(kind.is_some(), t.stream() == Stream::Deliveries, "{t}");
            if let Some(DeliveryEvent::Transition(d)) = t.delivery_event() {
                assert_eq!(d.event_type(), *t);
            }
        }
        for d in DeliveryTransition::ALL {
            assert_eq!(
                d.event_type().delivery_event(),
                Some(DeliveryEvent::Transition(*d))
            );
        }
    }

    #[test]
    fn ids() {
        assert_eq!(ids::delivery("n1", "desktop"), "dlv:n1:desktop");
        let long = "x".repeat(128);
        let id = ids::delivery(&long, "desktop");
        assert!(id.len() <= 128 && id.starts_with("dlv:~"), "{id}");
        assert_eq!(
            ids::parse_bridge_delivery(&ids::bridge_delivery("s:1", 7)),
            Some(("s:1", 7))
        );
        let c = ids::bridge_consumer("s1");
        assert_eq!(ids::subscription_of_consumer(&c), Some("s1"));
    }
}
