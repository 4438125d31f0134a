//! Zero-PII deliveries (spec section 14): the keyed hashes a redacting route writes in place of
//! a recipient and a notification id. The key comes from the configuration (`[privacy]
//! hmac_key = "env:NAME"`), never from the log: it is not in any event, nor in
//! `settings.updated`, nor in a `Debug` output.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The HMAC key of the redacting routes.
#[derive(Clone)]
pub struct Privacy {
    key: Vec<u8>,
}

impl std::fmt::Debug for Privacy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Privacy { key: <redacted> }")
    }
}

impl Privacy {
    /// A key of at least one byte.
    pub fn new(key: impl Into<Vec<u8>>) -> Option<Privacy> {
        let key = key.into();
        (!key.is_empty()).then_some(Privacy { key })
    }

    /// HMAC-SHA256(key, `text`), lower-case hex.
    pub fn hash(&self, text: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(text.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A redacted delivery's stand-in for a notification id.
    pub fn intent_key(&self, notification_id: &str) -> String {
        self.hash(notification_id)
    }

    /// A redacted delivery's stand-in for its recipient (`recipient_hash`).
    pub fn recipient_hash(&self, recipient: &str) -> String {
        self.hash(recipient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_4231_case_2_and_no_key_in_debug() {
        let p = Privacy::new(b"Jefe".to_vec()).unwrap();
        assert_eq!(
            p.hash("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(!format!("{p:?}").contains("Jefe"));
        assert!(Privacy::new(Vec::new()).is_none());
    }
}
