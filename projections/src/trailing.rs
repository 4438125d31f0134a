//! Trailing fields: a field added to a stored row after a release, encoded so that a row
//! which leaves it at its default keeps the exact bytes it had before (and so its digest,
//! spec I10; the golden directory checks this).
//!
//! With postcard a struct is its fields in order, with no names and no lengths. A trailing
//! field at its default is written as a unit, which is zero bytes; a set one as its value. On
//! decoding, a row that ends before the field (written before it existed, or at the default)
//! reads the default. Use it on **one** field, the last, of a struct that is stored on its own
//! (a table value), never inside a sequence: the bytes after it must be the end of the value.
//! Later additions go inside that field's type, as trailing fields of their own.
//!
//! ```ignore
//! #[serde(default, with = "crate::trailing")]
//! pub ext: Ext,                 // Ext: Default + PartialEq + Serialize + Deserialize
//! ```

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub fn serialize<T, S>(v: &T, s: S) -> Result<S::Ok, S::Error>
where
    T: Serialize + Default + PartialEq,
    S: Serializer,
{
    if *v == T::default() {
        s.serialize_unit()
    } else {
        v.serialize(s)
    }
}

pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
where
    T: Deserialize<'de> + Default,
    D: Deserializer<'de>,
{
    // The end of the input (an older row, or the default) reads as the default.
    Ok(T::deserialize(d).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Old {
        a: u32,
        b: String,
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq, Clone)]
    struct Ext {
        n: u32,
        s: Option<String>,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct New {
        a: u32,
        b: String,
        #[serde(default, with = "super")]
        ext: Ext,
    }

    #[test]
    fn a_default_trailing_field_keeps_the_old_bytes_and_old_rows_decode() {
        let old = postcard::to_stdvec(&Old {
            a: 7,
            b: "x".into(),
        })
        .unwrap();
        let new = New {
            a: 7,
            b: "x".into(),
            ext: Ext::default(),
        };
        assert_eq!(postcard::to_stdvec(&new).unwrap(), old);
        assert_eq!(postcard::from_bytes::<New>(&old).unwrap(), new);
        for ext in [
            Ext {
                n: 3,
                s: Some("y".into()),
            },
            Ext {
                n: 0,
                s: Some(String::new()),
            },
        ] {
            let set = New {
                a: 7,
                b: "x".into(),
                ext,
            };
            let bytes = postcard::to_stdvec(&set).unwrap();
            assert!(bytes.len() > old.len());
            assert_eq!(postcard::from_bytes::<New>(&bytes).unwrap(), set);
        }
    }
}
