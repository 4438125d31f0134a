//! The `tenant` label of the metrics (spec section 20), bounded in cardinality.
//!
//! A deployment may hold thousands of tenants; a Prometheus series per tenant per metric would
//! grow without bound. The first [`set_tenant_labels`] tenants a process meets are labelled by
//! name (`default` always is); every later one is labelled `other`, so a scrape never holds
//! more than that many `tenant` values per metric. Which tenants got names is decided in the
//! order they were first met since the process started.

use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many tenants are labelled by name when the configuration says nothing.
pub const DEFAULT_TENANT_LABELS: usize = 100;

/// The label of the tenants past the bound.
pub const OTHER: &str = "other";

static LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_TENANT_LABELS);
static NAMED: RwLock<Vec<&'static str>> = RwLock::new(Vec::new());

/// Label at most `n` tenants besides the default by name (`[server] metrics_tenant_labels`).
/// Tenants already labelled keep their label.
pub fn set_tenant_labels(n: usize) {
    LIMIT.store(n, Ordering::Relaxed);
}

/// The `tenant` label of `tenant`'s metrics: its name, or [`OTHER`] past the bound.
pub fn tenant_label(tenant: &str) -> &'static str {
    if tenant == tidemark_log::DEFAULT_TENANT {
        return tidemark_log::DEFAULT_TENANT;
    }
    let read = |named: &[&'static str]| named.iter().copied().find(|n| *n == tenant);
    {
        let named = NAMED.read().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = read(&named) {
            return n;
        }
        // Past the bound every later tenant is `other`: no write lock on the hot path.
        if named.len() >= LIMIT.load(Ordering::Relaxed) {
            return OTHER;
        }
    }
    let mut named = NAMED.write().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = read(&named) {
        return n;
    }
    if named.len() >= LIMIT.load(Ordering::Relaxed) {
        return OTHER;
    }
    // Bounded by the limit: at most that many names are ever kept for the process's life.
    let n: &'static str = Box::leak(tenant.to_owned().into_boxed_str());
    named.push(n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_tenants_share_one_label() {
        set_tenant_labels(3);
        assert_eq!(tenant_label("default"), "default");
        let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        let labels: Vec<&str> = names.iter().map(|n| tenant_label(n)).collect();
        assert_eq!(labels[..3], ["t0", "t1", "t2"]);
        assert!(labels[3..].iter().all(|l| *l == OTHER), "{labels:?}");
        // A labelled tenant keeps its label, the default needs none of the bound.
        assert_eq!(tenant_label("t1"), "t1");
        assert_eq!(tenant_label("default"), "default");
        assert_eq!(NAMED.read().unwrap().len(), 3);
    }
}
