// The guide's program uses the reqwest middleware: it is this module's documentation when
// the `reqwest` feature is on (as on docs.rs), a summary otherwise.
#![cfg_attr(feature = "reqwest", doc = include_str!("../docs/baggage.md"))]
#![cfg_attr(
    not(feature = "reqwest"),
    doc = "W3C `baggage`: the stain crosses services written in other languages, and every \
           other member of the request travels with it. The end-to-end guide (a chain through \
           a service in another language) is built with the `reqwest` feature.\n\n\
           ```\n\
           use gray_tower::{Carriers, baggage::DEFAULT_BAGGAGE_KEY};\n\
           let carriers = Carriers::default().with_baggage();\n\
           assert_eq!(carriers.baggage().unwrap().key(), DEFAULT_BAGGAGE_KEY);\n\
           ```"
)]

#[doc(inline)]
pub use gray_core::codec::{
    BaggageMember, DEFAULT_BAGGAGE_KEY, DEFAULT_MAX_MEMBERS, InheritedBaggage, W3C_MIN_BYTES,
    W3C_MIN_MEMBERS,
};
