//! [`WithPolicy`]: a strict configuration table that holds a policy's keys next to a
//! program's own, which `#[serde(flatten)]` cannot make strict.

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor},
};

use super::config::{Field, PolicyConfig};

/// A configuration table that holds a policy's keys ([`PolicyConfig::FIELDS`]) next to a
/// program's own (`T`), and rejects every other key with its line and field: what
/// `#[serde(flatten)] policy: PolicyConfig` cannot do (serde's `deny_unknown_fields` does
/// not work through `flatten`).
///
/// ```
/// use std::collections::BTreeMap;
///
/// use gray_config::{self as config, Format};
/// use gray_policy::{Fallback, Policy, WithPolicy};
/// use serde::Deserialize;
///
/// #[derive(Debug, Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Gateway {
///     services: BTreeMap<String, WithPolicy<Service>>,
/// }
///
/// /// The gateway's own keys of a service table.
/// #[derive(Debug, Default, Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Service {
///     pick: Option<String>,
/// }
///
/// let good = r#"{"services": {"orders": {"preset": "seed-000", "fallback": "any", "pick": "round-robin"}}}"#;
/// let gateway: Gateway = config::from_str(good, Format::Json, "gateway.json")?;
/// let orders = &gateway.services["orders"];
/// assert_eq!(orders.extra.pick.as_deref(), Some("round-robin"));
/// let policy = Policy::try_from(orders.policy.clone()).unwrap();
/// assert_eq!(policy.fallback(), Fallback::Any);
///
/// let typo = "{\"services\": {\"orders\": {\n  \"falback\": \"any\"\n}}}";
/// let err = config::from_str::<Gateway>(typo, Format::Json, "gateway.json").unwrap_err();
/// assert_eq!(err.line(), Some(2));
/// assert_eq!(err.field(), Some("services.orders.falback"));
/// assert!(err.message().starts_with("unknown field `falback`, expected one of `pick`, `name`, `preset`"), "{err}");
/// # Ok::<(), config::ConfigError>(())
/// ```
///
/// `T` is a struct deriving `Deserialize`; its own attributes (`default`, `rename`, …)
/// apply to its keys. A key that both know goes to the policy. When `T` reads keys it
/// does not declare (it flattens a map itself), `T` decides which keys it accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WithPolicy<T> {
    /// The policy's keys.
    #[serde(flatten)]
    pub policy: PolicyConfig,
    /// The program's own keys.
    #[serde(flatten)]
    pub extra: T,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for WithPolicy<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TableVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for TableVisitor<T> {
            type Value = WithPolicy<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table with a matching policy")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<WithPolicy<T>, A::Error> {
                let mut policy = PolicyConfig::default();
                let extra = T::deserialize(Rest {
                    map,
                    policy: &mut policy,
                    fields: struct_fields::<T>(),
                })?;
                Ok(WithPolicy { policy, extra })
            }
        }

        d.deserialize_map(TableVisitor(PhantomData))
    }
}

/// The keys of a table that are not the policy's, as a map for `T`; the policy's keys are
/// read into the policy on the way, straight from the format (so errors keep their
/// position).
struct Rest<'p, A> {
    map: A,
    policy: &'p mut PolicyConfig,
    /// `T`'s keys, when `T` is a struct: others are rejected here, listing all the keys.
    fields: Option<&'static [&'static str]>,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for Rest<'_, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Rest<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut seed = Some(seed);
        loop {
            let key = RouteKey {
                seed: &mut seed,
                fields: self.fields,
                policy: self.policy,
            };
            match self.map.next_key_seed(key)? {
                None => return Ok(None),
                Some(Routed::Extra(value)) => return Ok(Some(value)),
                Some(Routed::Policy(field)) => self.policy.set(field, &mut self.map)?,
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// Where a key of a [`WithPolicy`] table goes.
enum Routed<K> {
    Policy(Field),
    Extra(K),
}

/// Reads a key in the format's own key deserializer (so that an error carries the key's
/// position) and routes it.
struct RouteKey<'s, K> {
    seed: &'s mut Option<K>,
    fields: Option<&'static [&'static str]>,
    policy: &'s PolicyConfig,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for RouteKey<'_, K> {
    type Value = Routed<K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for RouteKey<'_, K> {
    type Value = Routed<K::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        if let Some(field) = self.policy.field(key)? {
            return Ok(Routed::Policy(field));
        }
        if let Some(fields) = self.fields
            && !fields.contains(&key)
        {
            return Err(E::custom(UnknownKey { key, fields }));
        }
        let seed = self
            .seed
            .take()
            .ok_or_else(|| E::custom("a key was read twice"))?;
        seed.deserialize(key.into_deserializer()).map(Routed::Extra)
    }
}

/// `unknown field `x`, expected one of …`, listing `T`'s keys and the policy's.
struct UnknownKey<'a> {
    key: &'a str,
    fields: &'static [&'static str],
}

impl fmt::Display for UnknownKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown field `{}`, expected one of ", self.key)?;
        for (i, name) in self.fields.iter().chain(PolicyConfig::FIELDS).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{name}`")?;
        }
        Ok(())
    }
}

/// The keys of `T` when it is a struct deriving `Deserialize` (which names them to
/// `deserialize_struct`), else `None`.
fn struct_fields<'de, T: Deserialize<'de>>() -> Option<&'static [&'static str]> {
    struct Probe<'a>(&'a mut Option<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = Some(fields);
            Err(de::Error::custom("probed"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields = None;
    // The probe always fails; only what it saw matters.
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use gray_config::{self as config, Format};

    use crate::{Fallback, Policy};

    /// The gateway's case: `[services.<name>]` holds the policy's keys and the program's own.
    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Service {
        pick: Option<String>,
        #[serde(default)]
        weight: u32,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Gateway {
        services: std::collections::BTreeMap<String, WithPolicy<Service>>,
    }

    #[test]
    fn with_policy_splits_a_table_and_rejects_unknown_keys_with_their_line() {
        let cases: &[(Format, &str)] = &[
            (
                Format::Json,
                "{\"services\": {\"orders\": {\"preset\": \"seed-000\", \"pick\": \"round-robin\",\n\"falback\": \"any\"}}}",
            ),
            (
                Format::Toml,
                "[services.orders]\npreset = \"seed-000\"\npick = \"round-robin\"\nfalback = \"any\"\n",
            ),
            (
                Format::Yaml,
                "services:\n  orders:\n    preset: seed-000\n    pick: round-robin\n    falback: any\n",
            ),
        ];
        for &(format, text) in cases {
            let err = config::from_str::<Gateway>(text, format, "gateway").unwrap_err();
            let line = text.lines().position(|l| l.contains("falback")).unwrap() + 1;
            assert_eq!(err.line(), Some(line), "{format}: {err}");
            assert_eq!(
                err.field(),
                Some("services.orders.falback"),
                "{format}: {err}"
            );
            assert_eq!(
                err.message(),
                "unknown field `falback`, expected one of `pick`, `weight`, `name`, `preset`, \
                 `lane_key`, `flag_key`, `flag_lane`, `flag_values`, `version_key`, \
                 `versions_key`, `unlabelled`, `fallback`, `on_unready`, `own_lane`, `enabled`",
                "{format}"
            );
            let good = text.replace("falback", "fallback");
            let gateway: Gateway = config::from_str(&good, format, "gateway").unwrap();
            let orders = &gateway.services["orders"];
            assert_eq!(
                orders.extra,
                Service {
                    pick: Some("round-robin".into()),
                    weight: 0
                }
            );
            let policy = Policy::try_from(orders.policy.clone()).unwrap();
            assert_eq!(policy.name(), "seed-000");
            assert_eq!(policy.fallback(), Fallback::Any, "{format}");
        }
    }

    #[test]
    fn with_policy_keeps_the_position_of_either_side() {
        // A bad policy value and a bad value of the program's own key, each at its line.
        let text =
            "{\"services\": {\"orders\": {\n\"pick\": \"x\",\n\"fallback\": \"sometimes\"}}}";
        let err = config::from_str::<Gateway>(text, Format::Json, "gw.json").unwrap_err();
        assert_eq!(err.field(), Some("services.orders.fallback"));
        assert_eq!(err.line(), Some(3));
        let text = "{\"services\": {\"orders\": {\"fallback\": \"any\",\n\"weight\": \"heavy\"}}}";
        let err = config::from_str::<Gateway>(text, Format::Json, "gw.json").unwrap_err();
        assert_eq!(err.field(), Some("services.orders.weight"));
        assert_eq!(err.line(), Some(2));
        assert!(
            err.message().starts_with("invalid type: string \"heavy\""),
            "{err}"
        );
        // A key that both sides know twice is refused like any duplicate.
        let text = "{\"services\": {\"orders\": {\"fallback\": \"any\", \"fallback\": \"any\"}}}";
        let err = config::from_str::<Gateway>(text, Format::Json, "gw.json").unwrap_err();
        assert!(
            err.message().contains("duplicate field `fallback`"),
            "{err}"
        );
    }

    #[test]
    fn flattened_policy_rejects_unknown_keys_too() {
        // Under `#[serde(flatten)]` a typo is still refused (without its line: use
        // `WithPolicy` for that).
        #[derive(Debug, serde::Deserialize)]
        struct Flat {
            #[allow(dead_code)]
            pick: Option<String>,
            #[serde(flatten)]
            #[allow(dead_code)]
            policy: PolicyConfig,
        }
        let err =
            config::from_str::<Flat>("pick = \"a\"\nfalback = \"any\"\n", Format::Toml, "f.toml")
                .unwrap_err();
        assert!(err.message().contains("unknown field `falback`"), "{err}");
    }
}
